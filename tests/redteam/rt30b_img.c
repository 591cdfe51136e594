/* rt30b_img.c: the image started without the library. usage: rt30b_img c|s TAG
   c: write 100000 bytes seed 20 to fd 1, read 100000 seed 21 from fd 0.
   s: read 100000 seed 20 from fd 0, write 100000 seed 21 to fd 1. Reports on stderr. */
#include "rt30b_common.h"
int main(int argc, char **argv) {
  char m[160]; long w = 0;
  const char *pre = getenv("LD_PRELOAD");
  int fi = 0, fo = 1; if (getenv("RT_FD")) fi = fo = atoi(getenv("RT_FD"));
  if (argv[1][0] == 'c') { w = wr_pat(fo, 20, 100000); rd_pat(fi, 21, 100000, m, sizeof m); }
  else { rd_pat(fi, 20, 100000, m, sizeof m); w = wr_pat(fo, 21, 100000); }
  fprintf(stderr, "IMG %s (%s): tx %ld; rx %s\n", argv[2], pre ? "LD_PRELOAD set!" : "no lib", w, m);
  return 0;
}
