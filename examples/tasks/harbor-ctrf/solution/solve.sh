#!/bin/bash
# Runs in the working folder (/app).
cat > fizzbuzz.py <<'PY'
import sys

for i in range(1, int(sys.argv[1]) + 1):
    print("FizzBuzz" if i % 15 == 0 else "Fizz" if i % 3 == 0 else "Buzz" if i % 5 == 0 else i)
PY
