#!/bin/bash
python3 - <<'PY'
import collections, csv
revenue = collections.Counter()
for row in csv.DictReader(open("/app/sales.csv")):
    revenue[row["region"]] += int(row["units"]) * float(row["price"])
open("/app/revenue.txt", "w").write(f"{sum(revenue.values()):.2f}\n")
open("/app/best_region.txt", "w").write(revenue.most_common(1)[0][0] + "\n")
PY
