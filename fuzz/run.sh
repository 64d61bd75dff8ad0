#!/usr/bin/env bash
# Fuzzes one target with AFL++ (through cargo-afl, on stable Rust) for a given CPU time.
#
#   fuzz/run.sh TARGET MINUTES
#
# TARGET is frame, handshake or resp; MINUTES is CPU time: the user and system time of the
# fuzzer and the target processes together, measured from /proc, so that a busy machine does
# not shorten a run (a wall-clock cap of four times as long, plus ten minutes, still applies).
# Installs what it needs first (cargo-afl and the AFL++ it builds; make and a C compiler from
# apt if missing). Starts from the generated seeds and the committed corpus, fuzzes one
# process under `nice -n 19`, then prints the results, replaces fuzz/corpus/TARGET with the
# minimized queue, copies any crash to fuzz/crashes/TARGET and fails if there was one.
#
# Environment: CARGO_TARGET_DIR (builds go to $CARGO_TARGET_DIR/afl for the instrumented
# targets, fuzz/target by default), FUZZ_OUT (the fuzzer's working directory, fuzz/out by
# default; deleted and recreated for TARGET), FUZZ_KEEP_CORPUS=1 (leave fuzz/corpus alone).
set -euo pipefail

usage() {
    echo "usage: $0 frame|handshake|resp MINUTES" >&2
    exit 2
}
[[ $# -eq 2 ]] || usage
target=$1
minutes=$2
case $target in frame | handshake | resp) ;; *) usage ;; esac
[[ $minutes =~ ^[0-9]+$ ]] || usage

here=$(cd "$(dirname "$0")" && pwd)
manifest=$here/Cargo.toml
target_dir=${CARGO_TARGET_DIR:-$here/target}
afl_target_dir=$target_dir/afl
work=${FUZZ_OUT:-$here/out}/$target

# --- Tools (each step does nothing if already done). ---
if ! command -v make >/dev/null || ! command -v cc >/dev/null; then
    apt-get update && apt-get install -y build-essential
fi
if ! cargo afl --version >/dev/null 2>&1; then
    cargo install cargo-afl
fi
if ! out=$(cargo afl config --build 2>&1); then
    # It refuses to build again what is already built; anything else is an error.
    grep -q "already built" <<<"$out" || {
        echo "$out" >&2
        exit 1
    }
fi

# --- Builds: the instrumented target, and the seed generator. ---
nice -n 19 cargo afl build --release --manifest-path "$manifest" --target-dir "$afl_target_dir" --bin "$target"
nice -n 19 cargo build --release --manifest-path "$manifest" --target-dir "$target_dir" --bin seeds
binary=$afl_target_dir/release/$target

# --- Inputs: the seeds and the committed corpus. ---
rm -rf "$work"
mkdir -p "$work/in"
"$target_dir/release/seeds" "$work/seeds" >/dev/null
cp "$work/seeds/$target"/* "$work/in/"
if [[ -d $here/corpus/$target ]]; then
    cp "$here/corpus/$target"/* "$work/in/" 2>/dev/null || true
fi
dict=()
[[ -f $here/dict/$target.dict ]] && dict=(-x "$here/dict/$target.dict")

# --- Fuzzing. ---
export AFL_SKIP_CPUFREQ=1 AFL_NO_AFFINITY=1 AFL_NO_UI=1
if [[ $(cat /proc/sys/kernel/core_pattern 2>/dev/null) == \|* ]]; then
    export AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES=1
fi

# CPU seconds of a process and all its descendants, reaped ones included (/proc/PID/stat:
# utime, stime, cutime and cstime are fields 14 to 17, in clock ticks).
cpu_seconds() {
    local pids=("$1") ticks=0 i=0 pid child stat fields
    while ((i < ${#pids[@]})); do
        pid=${pids[i]}
        i=$((i + 1))
        stat=$(cat "/proc/$pid/stat" 2>/dev/null) || continue
        read -ra fields <<<"${stat##*) }"
        ticks=$((ticks + fields[11] + fields[12] + fields[13] + fields[14]))
        for child in $(cat /proc/"$pid"/task/*/children 2>/dev/null); do
            pids+=("$child")
        done
    done
    echo $((ticks / $(getconf CLK_TCK)))
}

# The afl-fuzz process under `pid`.
afl_fuzz_of() {
    local pid=$1 child
    for child in $(cat /proc/"$pid"/task/*/children 2>/dev/null); do
        if [[ $(cat "/proc/$child/comm" 2>/dev/null) == afl-fuzz ]]; then
            echo "$child"
            return
        fi
        afl_fuzz_of "$child"
    done
}

log=$work/afl.log
echo "fuzzing $target for $minutes CPU-minutes; log in $log"
nice -n 19 cargo afl fuzz -i "$work/in" -o "$work/afl" "${dict[@]}" -- "$binary" >"$log" 2>&1 &
runner=$!
start=$(date +%s)
wall_cap=$((minutes * 4 * 60 + 600))
cpu=0
afl_bin=
while kill -0 "$runner" 2>/dev/null; do
    sleep 10
    cpu=$(cpu_seconds "$runner")
    fuzzer=$(afl_fuzz_of "$runner" || true)
    # AFL++'s tools are next to afl-fuzz (in cargo-afl's data directory).
    if [[ -z $afl_bin && -n $fuzzer ]]; then
        afl_bin=$(dirname "$(readlink -f "/proc/$fuzzer/exe")")
    fi
    if ((cpu >= minutes * 60 || $(date +%s) - start >= wall_cap)); then
        [[ -n $fuzzer ]] && kill -INT "$fuzzer"
        break
    fi
done
wait "$runner" || true
wall=$(($(date +%s) - start))

stats=$work/afl/default/fuzzer_stats
if [[ ! -f $stats ]]; then
    echo "afl-fuzz did not run; see $log" >&2
    tail -20 "$log" >&2
    exit 1
fi
field() { awk -v k="$1" '$1 == k { print $3 }' "$stats"; }
crashes=$(field saved_crashes)

# --- Corpus: the queue, minimized. ---
# (`cargo afl cmin` runs AFL++'s Python afl-cmin, which finds no coverage in these persistent
# targets; the shell version, afl-cmin.bash, does.)
if [[ ${FUZZ_KEEP_CORPUS:-0} != 1 ]]; then
    rm -rf "$work/cmin"
    AFL_PATH=$afl_bin nice -n 19 "$afl_bin/afl-cmin.bash" -i "$work/afl/default/queue" -o "$work/cmin" \
        -- "$binary" >"$work/cmin.log" 2>&1 || true
    if compgen -G "$work/cmin/*" >/dev/null; then
        rm -rf "$here/corpus/$target"
        mkdir -p "$here/corpus/$target"
        # Named by content, so that a corpus committed again changes only where it changed.
        for file in "$work/cmin"/*; do
            cp "$file" "$here/corpus/$target/$(sha1sum "$file" | cut -c1-16)"
        done
    else
        echo "minimizing the corpus failed (see $work/cmin.log); fuzz/corpus/$target is unchanged" >&2
    fi
fi
corpus_files=0 corpus_bytes=0
if [[ -d $here/corpus/$target ]]; then
    corpus_files=$(find "$here/corpus/$target" -type f | wc -l)
    corpus_bytes=$(du -sb "$here/corpus/$target" | cut -f1)
fi

if ((crashes > 0)); then
    mkdir -p "$here/crashes/$target"
    cp "$work/afl/default/crashes"/id* "$here/crashes/$target/"
fi

cat <<REPORT
target:        $target
fuzzer:        $(cargo afl --version 2>/dev/null | head -1) ($(awk '$1 == "afl_version" { print $3 }' "$stats"))
cpu minutes:   $((cpu / 60)).$(((cpu % 60) * 10 / 60)) (wall $((wall / 60)) min; afl run_time $(field run_time) s)
execs:         $(field execs_done) ($(field execs_per_sec)/s at the end)
crashes:       $crashes (hangs $(field saved_hangs))
queue:         $(field corpus_count) inputs; edges $(field edges_found) of $(field total_edges), bitmap $(field bitmap_cvg)
corpus:        $corpus_files files, $corpus_bytes bytes in fuzz/corpus/$target
REPORT
if ((crashes > 0)); then
    echo "crashes copied to fuzz/crashes/$target; replay one with: cargo run --release --manifest-path $manifest --bin $target -- FILE" >&2
    exit 1
fi
