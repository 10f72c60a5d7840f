#!/bin/bash
python3 -c '
import collections, json
counts = collections.Counter(line.split()[0] for line in open("/app/service.log") if line.strip())
json.dump({k: counts.get(k, 0) for k in ("INFO", "WARN", "ERROR")}, open("/app/counts.json", "w"))
'
