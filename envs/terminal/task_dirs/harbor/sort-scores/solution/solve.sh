#!/bin/bash
tail -n +2 /data/scores.csv | tr ',' ' ' | sort -k2,2nr -k1,1 > /data/ranking.txt
head -n 1 /data/ranking.txt | cut -d' ' -f1 > /data/top.txt
