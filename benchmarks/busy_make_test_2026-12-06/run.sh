#!/bin/sh
# make test on a fresh clone with one busy process beside it (issue 58's must-show)
# usage: git clone REPO /tmp/fresh && sh run.sh /tmp/fresh /tmp/busy_test.log
python3 -c "while True: pass" &
HOG=$!
start=$(date +%s)
cd "$1" && make test > "$2" 2>&1
rc=$?
end=$(date +%s)
kill $HOG
echo "rc=$rc seconds=$((end-start))" >> "$2"
echo done >> "$2"
