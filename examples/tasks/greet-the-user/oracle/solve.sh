#!/bin/sh
# The oracle knows what asking reveals: the user reads French.
echo 'Bonjour !' > greeting.txt
