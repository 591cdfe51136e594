#!/bin/bash
# Builds the round 30b probes into /tmp/rt30b (the paths of the images are fixed there).
set -e; cd "$(dirname "$0")"; mkdir -p /tmp/rt30b
gcc -O1 -o /tmp/rt30b/thr rt30b_thr.c -lpthread
gcc -O1 -o /tmp/rt30b/x rt30b_x.c -lpthread
gcc -O1 -o /tmp/rt30b/spawn rt30b_spawn.c
gcc -O1 -o /tmp/rt30b/img rt30b_img.c
gcc -O1 -static -o /tmp/rt30b/img_static rt30b_img.c
gcc -O1 -o /tmp/rt30b/texec rt30b_texec.c -lpthread
gcc -O1 -static -DIMG -o /tmp/rt30b/echoimg_static rt30b_texec.c
