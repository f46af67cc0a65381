#!/usr/bin/env bash
# netns_shaped.sh — a weight update between emulated hosts with shaped links, measured against
# the planner's estimate for the same links (issues #30 and #34).
#
# Each "node" is a network namespace with a veth pair to a bridge in the root namespace: one
# trainer node holding N trainer agents, R replica nodes each holding the rollout agents of one
# replica (--tp of them), and a controller node. tc shapes every trainer and replica node's link
# in both directions (a tbf of --rate on the node's side, its egress, and on the bridge's side,
# its ingress), as a NIC's line rate would. A real wb-controller and real wb-agents (synthetic
# weights, host memory) run the job over libfabric tcp, each agent's --tx-domain the node's veth;
# the model is a Qwen3 (configs/models/qwen3.yaml) of a few hundred MB (--layers, --hidden). The
# script times --versions transfers ("complete in" as wb-ctl transfer reports it; the median),
# checks one more version's rollout bytes against the independent reference (wb-ctl verify),
# and runs `wb-plan --estimate` on the same layouts with a hardware file describing the same
# links: a GPU's NIC is its share of its node's link (--rate / N for a trainer, --rate / tp for a
# rollout), at 95.6 % efficiency (1448 bytes of TCP payload in each 1514-byte frame the tbf
# counts); the other rates are stated assumptions for agents on a CPU. It prints the measured
# time, the estimate and their ratio.
#
# --keys 'YAML' adds job keys to the run (one flow-style line or several lines), --keys-b 'YAML'
# runs a second configuration in the same call (e.g. 'relay: chain', 'delta: {enabled: true}'),
# with --plan-b 'ARGS' as the extra wb-plan arguments of its estimate (e.g. '--changed 0.002'),
# and prints the ratio of the two, measured and estimated. Namespaces, bridge and processes are
# removed on exit (any exit: a trap). Without root, ip, tc, network namespaces, a bridge or tbf
# it prints "skipped: <reason>" and exits 0. --trace: every agent writes a Chrome trace of each
# version (when each tensor landed, each trainer's writes) into LOGS/<a|b>/trace.
#
# Usage: bench/netns_shaped.sh [--rate 1gbit] [--trainers N] [--replicas R] [--tp G]
#            [--layers L] [--hidden H] [--vocab V] [--fp8] [--versions V] [--mode auto|direct|gather]
#            [--keys YAML] [--keys-b YAML] [--plan-b ARGS] [--smoke] [--build DIR]
#            [--logs DIR] [--trace] [--timeout S]
#   defaults: 1gbit, 2 trainers, 2 replicas of 1 rollout, 8 layers of hidden 1024 (332 MB BF16),
#   3 versions timed and a 4th verified. --smoke: 100mbit, 1 trainer, 1 replica, 2 layers of
#   hidden 256, vocab 1024 (4 MB), 2 versions, every one verified (tests/sh/netns_shaped_test.sh
#   runs it; it never judges times). Programs from --build DIR/bin (default $WB_BIN, else
#   build/bin); run from the repository root.
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
rate=1gbit trainers=2 replicas=2 tp=1 layers=8 hidden=1024 vocab=32000 fp8=0 versions=3
mode=auto trace=0 keys="" keys_b="" plan_b="" smoke=0 bin=${WB_BIN:-$here/build/bin} logs="" limit=300
two=0
while [ $# -gt 0 ]; do
    case "$1" in
    --rate) rate=$2 ;;
    --trainers) trainers=$2 ;;
    --replicas) replicas=$2 ;;
    --tp) tp=$2 ;;
    --layers) layers=$2 ;;
    --hidden) hidden=$2 ;;
    --vocab) vocab=$2 ;;
    --versions) versions=$2 ;;
    --mode) mode=$2 ;;
    --keys) keys=$2 ;;
    --keys-b) keys_b=$2 two=1 ;;
    --plan-b) plan_b=$2 two=1 ;;
    --build) bin=$2/bin ;;
    --logs) logs=$2 ;;
    --timeout) limit=$2 ;;
    --fp8) fp8=1; shift; continue ;;
    --trace) trace=1; shift; continue ;;
    --smoke)
        smoke=1 rate=100mbit trainers=1 replicas=1 tp=1 layers=2 hidden=256 vocab=1024 versions=2
        shift
        continue
        ;;
    -h | --help)
        sed -n '2,36p' "$0"
        exit 0
        ;;
    *)
        echo "netns_shaped: unknown argument '$1' (--help)" >&2
        exit 2
        ;;
    esac
    [ $# -ge 2 ] || { echo "netns_shaped: $1 needs a value" >&2; exit 2; }
    shift 2
done
num() { [[ "$2" =~ ^[0-9]+$ ]] && [ "$2" -ge "$3" ] || { echo "netns_shaped: $1: expected a number >= $3, got '$2'" >&2; exit 2; }; }
num --trainers "$trainers" 1
num --replicas "$replicas" 1
num --tp "$tp" 1
num --layers "$layers" 1
num --hidden "$hidden" 128
num --vocab "$vocab" 128
num --versions "$versions" 1
num --timeout "$limit" 1
[ $((hidden % 128)) -eq 0 ] || { echo "netns_shaped: --hidden: a multiple of 128, got $hidden" >&2; exit 2; }
case "$mode" in auto | direct | gather) ;; *) echo "netns_shaped: --mode: auto, direct or gather, got '$mode'" >&2; exit 2 ;; esac
# the rate as tc reads it, and in Gbit/s for the hardware file
gbps=$(awk -v r="$rate" 'BEGIN { if (match(r, /^[0-9.]+/) == 0) exit 1; v = substr(r, 1, RLENGTH);
    u = substr(r, RLENGTH + 1); f = u == "gbit" ? 1 : u == "mbit" ? 1e-3 : u == "kbit" ? 1e-6 : -1;
    if (f < 0 || v <= 0) exit 1; printf "%.9g", v * f }') ||
    { echo "netns_shaped: --rate: expected a rate such as 1gbit or 500mbit, got '$rate'" >&2; exit 2; }
for p in wb-controller wb-agent wb-ctl wb-plan; do
    [ -x "$bin/$p" ] || { echo "netns_shaped: $bin/$p is not built (make all, or --build DIR)" >&2; exit 1; }
done

skip() { echo "skipped: $1"; exit 0; }
[ "$(id -u)" -eq 0 ] || skip "network namespaces need root"
command -v ip >/dev/null || skip "no ip command (iproute2)"
command -v tc >/dev/null || skip "no tc command (iproute2)"

id=$$
pre=wbs$id
br=${pre}b
nodes=(c t)
for ((k = 0; k < replicas; k++)); do nodes+=("r$k"); done
net=$((id % 200 + 20))
pids=()
work=$(mktemp -d "${TMPDIR:-/tmp}/netns_shaped.XXXXXX")
[ -n "$logs" ] || logs=$work/logs
mkdir -p "$logs"
cleanup() {
    for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
    wait 2>/dev/null
    for n in "${nodes[@]}"; do ip netns del "$pre-$n" 2>/dev/null; done
    # a namespace something still holds (a socket closing) outlives its name, and so does its
    # veth pair: deleting our end deletes both, so no stray interface is left in the root
    # namespace for later programs to bind to
    for n in "${nodes[@]}"; do ip link del "$pre$n" 2>/dev/null; done
    ip link del "$br" 2>/dev/null
    rm -rf "$work/dump" "$work"/*.yaml "$work"/*.json
    [ "$logs" = "$work/logs" ] && rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
ip netns add "$pre-c" 2>/dev/null || skip "cannot create network namespaces here (ip netns add failed)"
ip link add "$br" type bridge 2>/dev/null && ip link set "$br" up ||
    skip "cannot make a bridge in the root namespace"
addr() { echo "10.214.$net.$(($1 + 1))"; } # node index -> address
burst=$(awk -v g="$gbps" 'BEGIN { b = g * 1e9 / 8 / 1000; printf "%d", b < 262144 ? 262144 : b }')
for i in "${!nodes[@]}"; do
    n=${nodes[$i]} ns=$pre-${nodes[$i]} peer=$pre${nodes[$i]}
    { [ "$n" = c ] || ip netns add "$ns"; } &&
        ip link add "$peer" type veth peer name wb0 netns "$ns" &&
        ip link set "$peer" master "$br" && ip link set "$peer" up &&
        ip -n "$ns" addr add "$(addr "$i")/24" dev wb0 && ip -n "$ns" link set wb0 up &&
        ip -n "$ns" link set lo up ||
        skip "cannot wire namespaces with veth pairs and a bridge here"
    [ "$n" = c ] && continue # the controller's link is not shaped: control messages only
    tc -n "$ns" qdisc add dev wb0 root tbf rate "$rate" burst "$burst" latency 100ms 2>/dev/null &&
        tc qdisc add dev "$peer" root tbf rate "$rate" burst "$burst" latency 100ms 2>/dev/null ||
        skip "cannot shape a veth with tc tbf here"
done
url=tcp://$(addr 0):7420
export WB_TOKEN=netns-shaped-$id-$RANDOM

# ---------------------------------------------------------------- the model, layouts, hardware
heads=$((hidden / 64)) kv=$((hidden / 128))
inter=$((hidden * 3))
qc=""
[ $fp8 -eq 1 ] && qc=', "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128], "activation_scheme": "dynamic"}'
cat >"$work/config.json" <<EOF
{"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "head_dim": 64,
 "hidden_size": $hidden, "intermediate_size": $inter, "num_attention_heads": $heads,
 "num_key_value_heads": $kv, "num_hidden_layers": $layers, "vocab_size": $vocab,
 "tie_word_embeddings": false, "torch_dtype": "bfloat16"$qc}
EOF
hw() { # name, Gbit/s per GPU
    cat <<EOF
hardware:
  # $1: this GPU's share of its node's tc-shaped link ($rate for the node); 95.6 % = 1448 bytes
  # of TCP payload per 1514-byte frame. The rest: assumptions for agents on a CPU, not fitted.
  name: $1
  nic_gbps: $2
  nics_per_gpu: 1
  nic_efficiency: 0.956
  nvlink_GBps: 5
  h2d_GBps: 5
  copy_GBps: 5
  quant_GBps: 1
  kernel_launch: 5us
  write_submit: 5us
  barrier: 1ms
  collective_launch: 100us
EOF
}
{
    echo "world_size: $trainers"
    echo "gpus_per_node: $trainers"
    echo "mesh: [{name: fsdp, size: $trainers}]"
    echo "placements: [{match: \"*\", place: {fsdp: shard(0)}}]"
    hw shaped-trainer "$(awk -v g="$gbps" -v n="$trainers" 'BEGIN { printf "%.9g", g / n }')"
} >"$work/trainer.yaml"
{
    echo "replicas: $replicas"
    echo "gpus_per_replica: $tp"
    echo "tp: $tp"
    echo "gpus_per_node: $tp"
    hw shaped-rollout "$(awk -v g="$gbps" -v n="$tp" 'BEGIN { printf "%.9g", g / n }')"
} >"$work/rollout.yaml"
job() { # extra keys
    cat <<EOF
name: netns-shaped
listen: $url
model:
  rules: $here/configs/models/qwen3.yaml
  hf_config: $work/config.json
trainer_layout: $work/trainer.yaml
rollout_layout: $work/rollout.yaml
mode: $mode
mem_cap: 64MiB
seed: 7
provider: tcp
heartbeat: 200ms
suspect_after: 3s
dead_after: 30s
EOF
    [ -n "$1" ] && printf '%s\n' "$1"
}

# ---------------------------------------------------------------- one configuration
in_ns() { local n=$1; shift; ip netns exec "$pre-$n" "$@"; }
# the same for a program started with &: exec, so that $! is the program itself (a killed
# subshell would leave it running, holding its namespace and veth pair)
bg_ns() { local n=$1; shift; exec ip netns exec "$pre-$n" "$@"; }
ctl() { in_ns c "$bin/wb-ctl" -c "$url" "$@"; }
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

# run LABEL KEYS: the job's versions; sets med (seconds), verified, sent
run() {
    local label=$1 extra=$2 d=$logs/$1
    mkdir -p "$d"
    rm -rf "$work/dump"
    mkdir -p "$work/dump"
    [ $trace -eq 1 ] && mkdir -p "$d/trace"
    job "$extra" >"$work/job-$label.yaml"
    pids=()
    local tr=()
    [ $trace -eq 1 ] && tr=(--trace "$d/trace")
    bg_ns c "$bin/wb-controller" --config "$work/job-$label.yaml" >"$d/controller.log" 2>&1 &
    pids+=($!)
    for ((r = 0; r < trainers; r++)); do
        WB_LOG=info bg_ns t "$bin/wb-agent" --role trainer --rank $r --controller "$url" \
            --tx-domain wb0 ${tr[@]+"${tr[@]}"} >"$d/trainer$r.log" 2>&1 &
        pids+=($!)
    done
    # a rollout dumping a version for the check is slower to commit it: one more version, not
    # timed, is dumped and verified (the smoke run verifies every version and judges no time)
    local from=$((versions + 1)) total=$((versions + 1))
    [ $smoke -eq 1 ] && from=1 total=$versions
    for ((q = 0; q < replicas * tp; q++)); do
        bg_ns "r$((q / tp))" "$bin/wb-agent" --role rollout --rank $q --controller "$url" \
            --tx-domain wb0 ${tr[@]+"${tr[@]}"} --dump "$work/dump" --dump-from "$from" >"$d/rollout$q.log" 2>&1 &
        pids+=($!)
    done
    printf '%s\n' "${pids[@]}" >"$d/pids" # the processes of the run (the smoke test checks them)
    local ready=0
    for ((i = 0; i < limit * 5; i++)); do
        if ctl --timeout 2s status 2>/dev/null | grep -q ": ready"; then
            ready=1
            break
        fi
        kill -0 "${pids[0]}" 2>/dev/null || break
        sleep 0.2
    done
    if [ $ready -ne 1 ]; then
        echo "netns_shaped: $label: the job did not become ready; controller log:"
        tail -n 20 "$d/controller.log"
        return 1
    fi
    local times=()
    for ((v = 1; v <= total; v++)); do
        # the synthetic trainers make a version's values after the one before was sent (an
        # "optimizer step"); a transfer asked for earlier would wait for them and count that
        local n=0
        for ((i = 0; i < limit * 10 && n < trainers; i++)); do
            n=$(grep -l "version $v's values ready" "$d"/trainer*.log 2>/dev/null | wc -l)
            [ "$n" -lt "$trainers" ] && sleep 0.1
        done
        [ "$n" -lt "$trainers" ] && echo "  $label version $v: values not reported ready; asked anyway"
        if ! ctl --timeout "${limit}s" transfer --version $v >"$d/result$v.txt" 2>&1; then
            echo "netns_shaped: $label: transfer $v failed:"
            cat "$d/result$v.txt"
            return 1
        fi
        local ms
        ms=$(sed -n 's/^transfer [0-9]*: complete in \([0-9.]*\) ms.*/\1/p' "$d/result$v.txt")
        [ -n "$ms" ] || { echo "netns_shaped: $label: no time in:"; cat "$d/result$v.txt"; return 1; }
        local sec
        sec=$(awk -v m="$ms" 'BEGIN { printf "%.4f", m / 1000 }')
        if [ $v -le $versions ]; then
            times+=("$sec")
            echo "  $label version $v: $sec s"
        else
            echo "  $label version $v: $sec s (dumped for the check, not timed)"
        fi
        if [ $v -ge $from ]; then
            if ! in_ns c "$bin/wb-ctl" verify --config "$work/job-$label.yaml" --dump "$work/dump" \
                --version $v >"$d/verify$v.txt" 2>&1; then
                echo "netns_shaped: $label: version $v's rollout bytes differ from the reference:"
                tail -n 20 "$d/verify$v.txt"
                return 1
            fi
            echo "  $label version $v: verified ($(tail -n 1 "$d/verify$v.txt"))"
        fi
    done
    ctl --timeout 10s shutdown >/dev/null 2>&1
    for p in "${pids[@]}"; do # they exit on the shutdown; what is left after 5 s is killed
        for ((i = 0; i < 50; i++)); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$p" 2>/dev/null
    done
    wait 2>/dev/null
    pids=()
    med=$(printf '%s\n' "${times[@]}" | median)
    range=$(printf '%s\n' "${times[@]}" | sort -g | sed -n '1p;$p' | paste -sd-)
}

# estimate EXTRA_PLAN_ARGS: sets est (seconds)
estimate() {
    # shellcheck disable=SC2086 # a word list
    "$bin/wb-plan" --model "$here/configs/models/qwen3.yaml" --config "$work/config.json" \
        --trainer "$work/trainer.yaml" --rollout "$work/rollout.yaml" --mode "$mode" --estimate \
        $1 >"$2" 2>&1 || { echo "netns_shaped: wb-plan failed:"; cat "$2"; return 1; }
    est=$(sed -n 's/^  estimate: \([0-9.]*\) s against.*/\1/p' "$2")
    [ -n "$est" ] || est=$(sed -n 's/^estimate: \([0-9.]*\) s .*/\1/p' "$2")
    [ -n "$est" ] || { echo "netns_shaped: no estimate in:"; cat "$2"; return 1; }
}

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", (b > 0 ? a / b : 0) }'; }
oneline() { printf '%s' "${1//$'\n'/; }"; } # job keys of several lines, as one for a label
echo "== netns_shaped: 1 trainer node ($trainers agents) -> $replicas replica node(s) ($tp rollout(s) each), links $rate each way (tbf), libfabric tcp; logs in $logs"
estimate "" "$logs/plan-a.txt" || exit 1
grep -E '^  (rollout dtype|bytes):' "$logs/plan-a.txt"
run a "$keys" || exit 1
med_a=$med est_a=$est
echo "a${keys:+ ($(oneline "$keys"))}: median $med_a s of $versions versions ($range), estimate $est_a s: measured / estimate $(ratio "$med_a" "$est_a")"
if [ $two -eq 1 ]; then
    estimate "$plan_b" "$logs/plan-b.txt" || exit 1
    run b "$keys_b" || exit 1
    med_b=$med est_b=$est
    echo "b${keys_b:+ ($(oneline "$keys_b"))}${plan_b:+ [wb-plan $plan_b]}: median $med_b s of $versions versions ($range), estimate $est_b s: measured / estimate $(ratio "$med_b" "$est_b")"
    echo "b / a: measured $(ratio "$med_b" "$med_a"), estimated $(ratio "$est_b" "$est_a")"
fi
echo "netns_shaped: ok"
