#!/bin/sh
echo 'Hello, reroll!' > hello.txt
