#!/bin/bash
cp /solution/config.ini /srv/web/config.ini
