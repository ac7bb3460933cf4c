#!/usr/bin/env bash
# Pack Festival (with its English festvox voices) and Flite into one relocatable folder, for hosts without apt.
#
#   scripts/pack_synthesisers.sh [OUT_DIR]                          # default: outputs/synthesisers
#   PACK_ENGINES=festival scripts/pack_synthesisers.sh [OUT_DIR]    # Festival only (no Flite: about 11 MB less)
#
# Also writes OUT_DIR.tar.xz (what to carry to the training host: extract it anywhere, point
# voices.synthesisers_dir at the folder).
#
# On a Debian/Ubuntu machine with apt (no root needed for `apt-get download`): downloads the .debs of
# PACKAGES, extracts them with `dpkg-deb -x` into OUT_DIR/root, then adds the .debs of every shared library
# that the extracted festival and flite binaries load and that is neither in the tree nor part of the C/C++
# runtime every host has (glibc, libstdc++, libgcc), so the copy runs where none of these packages is
# installed. OUT_DIR/bin/{festival,flite} are launchers that run the extracted binaries with the tree's
# libraries (LD_LIBRARY_PATH) and Festival's library folder (--libdir); the recipe finds them through
# `synthesisers_dir` (fastdecode_lab.tiny_models.engines). The .debs themselves are removed after extraction.
# Check it with a clean environment:  env -i OUT_DIR/bin/flite -voice slt -t "hello" -o /tmp/x.wav
# (tests/test_tiny_voices.py runs both launchers with the system's copies hidden when FASTDECODE_SYNTHESISERS names
# OUT_DIR).
set -euo pipefail

OUT="$(realpath -m "${1:-outputs/synthesisers}")"
# the English voices Debian offers (apt-cache search festvox): kal and ked (diphone, 16 kHz), slt (HTS)
ENGINES=(${PACK_ENGINES:-festival flite})
PACKAGES=()
for engine in "${ENGINES[@]}"; do
  case "$engine" in
    festival) PACKAGES+=(festival libestools2.5 festlex-cmu festlex-poslex
                         festvox-kallpc16k festvox-kdlpc16k festvox-us-slt-hts) ;;
    flite) PACKAGES+=(flite libflite1) ;;
    *) echo "unknown engine $engine; valid: festival flite" >&2; exit 2 ;;
  esac
done
# runtime libraries every Linux host with Python and PyTorch has: never packed
HOST_LIBS='^(libc|libm|libdl|libpthread|librt|ld-linux-x86-64|libstdc\+\+|libgcc_s|linux-vdso)\.so'

ROOT="$OUT/root"
DEBS="$OUT/debs"
rm -rf "$OUT"
mkdir -p "$ROOT" "$DEBS" "$OUT/bin"

fetch() {  # apt-get download + extract the named packages
  (cd "$DEBS" && apt-get download "$@" >/dev/null)
  for deb in "$DEBS"/*.deb; do dpkg-deb -x "$deb" "$ROOT"; done
  rm -f "$DEBS"/*.deb
}

libpath() {  # the tree's library folders, colon-separated
  find "$ROOT" -name '*.so*' -printf '%h\n' | sort -u | paste -sd:
}

fetch "${PACKAGES[@]}"
# the libraries the binaries still take from the system: add their packages, until nothing is missing
for _ in 1 2 3 4; do
  missing=$(LD_LIBRARY_PATH="$(libpath)" ldd "${ENGINES[@]/#/$ROOT/usr/bin/}" \
    | awk '/=>/ {print $1, $3}' | grep -vE "^($HOST_LIBS)" | awk -v root="$ROOT" 'index($2, root) != 1 {print $2}' \
    | sort -u)
  [ -z "$missing" ] && break
  pkgs=$(for lib in $missing; do dpkg -S "$(realpath "$lib")" 2>/dev/null || dpkg -S "$lib"; done \
    | cut -d: -f1 | sort -u)
  echo "adding the libraries' packages: $(echo $pkgs)"
  fetch $pkgs
done
rmdir "$DEBS"
# what training never reads
rm -rf "$ROOT/usr/share/doc" "$ROOT/usr/share/man" "$ROOT/usr/share/lintian" "$ROOT/usr/share/emacs" \
  "$ROOT/usr/share/locale" "$ROOT/usr/share/info"
# Debian's Festival names /usr/share/festival in three files: make them follow --datadir
FEST="$ROOT/usr/share/festival"
if [ -d "$FEST" ]; then
sed -i "s|'(\"/usr/share/festival/languages/\" )|(list (path-as-directory (path-append datadir \"languages\")))|" "$FEST/languages.scm"
sed -i "s|(path-as-directory \"/usr/share/festival/dicts/\")|(path-as-directory (path-append datadir \"dicts\"))|" "$FEST/lexicons.scm"
sed -i "s|'(\"/usr/share/festival/voices/\")|(list (path-as-directory (path-append datadir \"voices\")))|" "$FEST/voices.scm"
if grep -l '"/usr/share/festival' "$FEST"/*.scm; then echo "Festival still names /usr/share/festival" >&2; exit 1; fi
fi

cat > "$OUT/bin/festival" <<'EOF'
#!/bin/sh
# the packed Festival: its libraries and its library folder (voices, lexicons) from this tree
HERE="$(cd "$(dirname "$0")/.." && pwd)"
LD_LIBRARY_PATH="$(find "$HERE/root" -name '*.so*' -printf '%h\n' | sort -u | paste -sd:)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
  exec "$HERE/root/usr/bin/festival" --libdir "$HERE/root/usr/share/festival" \
  --datadir "$HERE/root/usr/share/festival" "$@"
EOF
cat > "$OUT/bin/flite" <<'EOF'
#!/bin/sh
# the packed Flite, with its voice libraries from this tree
HERE="$(cd "$(dirname "$0")/.." && pwd)"
LD_LIBRARY_PATH="$(find "$HERE/root" -name '*.so*' -printf '%h\n' | sort -u | paste -sd:)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
  exec "$HERE/root/usr/bin/flite" "$@"
EOF
for launcher in festival flite; do
  if [ -x "$ROOT/usr/bin/$launcher" ]; then chmod +x "$OUT/bin/$launcher"; else rm "$OUT/bin/$launcher"; fi
done
XZ_OPT=-9 tar -C "$(dirname "$OUT")" -cJf "$OUT.tar.xz" "$(basename "$OUT")"
echo "packed ${ENGINES[*]}: $OUT ($(du -sh "$OUT" | cut -f1)); $OUT.tar.xz: $(stat -c %s "$OUT.tar.xz") bytes"
