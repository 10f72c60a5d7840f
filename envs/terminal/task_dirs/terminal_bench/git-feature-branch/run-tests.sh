#!/bin/bash
cd /repo
pytest $TEST_DIR/test_outputs.py -rA
