#!/bin/sh
# The reference solution: one ledger entry, then done.txt.
set -e
mkdir -p /tmp/ledger
python3 -c "
import sqlite3
db = sqlite3.connect('/tmp/ledger/ledger.db')
db.execute('create table if not exists entries(step, note)')
db.execute(\"insert into entries values (0, 'entry 0')\")
db.commit()
"
echo done > done.txt
