#!/usr/bin/env bash
# Load time of SmolLM2 in fresh processes (import + LLM(); the first after a cache-key change compiles
# the graphs again). Run from the repository root, quiet machine.
for i in 1 2 3; do
.venv/bin/python -c "
import time; t=time.perf_counter()
from flashtree import LLM
t1=time.perf_counter()
LLM(model='smollm2-135m-instruct', method='ar')
print('import', round(t1-t,2), 'LLM', round(time.perf_counter()-t1,2), 'total', round(time.perf_counter()-t,2))
" 2>&1 | grep "^import"
done
