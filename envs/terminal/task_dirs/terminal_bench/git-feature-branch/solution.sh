#!/bin/bash
cd /repo
git checkout -q -b feature/greeting main
echo "hello, world" > greeting.txt
git add greeting.txt
git commit -q -m "add greeting"
