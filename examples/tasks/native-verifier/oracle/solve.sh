#!/bin/sh
printf 'Hello, %s!\n' "$GREETING_NAME" > greeting.txt
