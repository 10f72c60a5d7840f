#!/bin/bash
# hidden-test-marker-b5f2
pytest $TEST_DIR/test_outputs.py -rA
