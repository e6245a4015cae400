#!/bin/sh
# libcurl is loaded at run time by the first s3:// open (src/s3/curl_api.c),
# never linked: no ELF given here may name it in its DT_NEEDED entries
# (readelf -d), so that a process without S3 never needs it and auditwheel
# never grafts it (and the TLS, Kerberos and LDAP libraries under it) into
# the wheel. Each file must list libc.so.6, or readelf's output was not
# read right and an absent libcurl would prove nothing.
# Usage: check_no_libcurl.sh ELF...   (the library, the command, a program
# linked to the static library)
fail=0
for elf in "$@"; do
  out=$(readelf -d "$elf") || { echo "FAIL: readelf -d $elf failed"; exit 1; }
  needed=$(printf '%s\n' "$out" | sed -n 's/.*(NEEDED).*\[\(.*\)\].*/\1/p' | tr '\n' ' ')
  echo "$(basename "$elf") needs: $needed"
  case " $needed" in
    *" libc.so.6 "*) ;;
    *) echo "FAIL: $elf: no libc.so.6 among its DT_NEEDED: readelf -d gave:"; echo "$out"; fail=1; continue ;;
  esac
  case "$needed" in
    *libcurl*) echo "FAIL: $elf needs libcurl at load time (DT_NEEDED): s3:// must dlopen it instead"; fail=1 ;;
  esac
done
[ "$#" -gt 0 ] || { echo "usage: check_no_libcurl.sh ELF..."; exit 2; }
[ "$fail" = 0 ] && echo "ok: no libcurl among the DT_NEEDED of $# files"
exit "$fail"
