#!/bin/bash
# oracle-marker-7a0c
echo kestrel-4e1d-vault-91c7 > "/app/code.txt"
