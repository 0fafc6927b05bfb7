#!/bin/sh
cat > wordcount.py <<'PY'
import collections
import re
import sys

words = re.findall(r"[a-z]+", open(sys.argv[1]).read().lower())
for word, count in sorted(collections.Counter(words).items(), key=lambda item: (-item[1], item[0])):
    print(word, count)
PY
