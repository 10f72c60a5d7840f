#!/bin/bash
cd ~/inbox && grep -l URGENT -- * | sort > ~/report.txt
