#!/bin/bash
pass=0
expected=$'ada 91\ncyd 91\neve 88\nbob 78\nfin 78\ndee 65'
[ "$(cat /data/ranking.txt 2>/dev/null)" = "$expected" ] && pass=$((pass + 1))
[ "$(tr -d '[:space:]' < /data/top.txt 2>/dev/null)" = "ada" ] && pass=$((pass + 1))
echo "passed $pass of 2"
python3 -c "import json; json.dump({'reward': $pass / 2}, open('/logs/verifier/reward.json', 'w'))"
