#!/bin/sh
cat > NOTES.md <<'NOTE'
# Version 2.1

`reroll rescore` now scores a recorded run again. Judged rewards are reproducible: the judge's
answers are recorded beside the run and replayed, so the same run gets the same reward.
NOTE
