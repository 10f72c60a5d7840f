#!/bin/bash
# oracle-marker-7a0c: the code sits next to this script
cat "$(dirname "${BASH_SOURCE[0]}")/code.txt" > /app/code.txt
