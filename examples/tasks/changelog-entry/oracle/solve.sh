#!/bin/sh
cat > CHANGES.md <<'ENTRY'
## 2.2

`reroll rescore --judge-model M` judges a recorded run again, live, with the judge model M;
without it the recorded judge is replayed.
ENTRY
