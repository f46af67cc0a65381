#!/usr/bin/env bash
# overload_test.sh — 64 agents on this machine with the job's default liveness settings
# (heartbeat 200 ms, dead_after 1.5 s): 32 trainers (FSDP 8 x EP 4) and 32 rollouts (16 FP8
# replicas of TP 2) of the demo model, over tcp on loopback, all real processes. Three versions
# complete, no agent is ever declared dead (a process that is merely slow under CPU pressure is
# not dead), and every rollout byte of the last version equals the reference. Prints the
# harness tally.
build=$(cd "$(dirname "$0")/.." && pwd)
root=$(pwd)
bin=${WB_BIN:-$build/bin}
name="overload 64 agents, 3 versions"
echo "$name ..."
tmp=$(mktemp -d /tmp/wb-overload.XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
    wait 2>/dev/null
    [ -n "${WB_KEEP:-}" ] && echo "    logs: $tmp" || rm -rf "$tmp"
}
trap cleanup EXIT
fail() {
    echo "    $1"
    [ -f "$tmp/controller.log" ] && grep -v ' heartbeat' "$tmp/controller.log" | tail -n 20 |
        sed 's/^/    | /'
    echo "FAIL $name"
    echo "0 passed, 1 failed, 0 skipped"
    exit 1
}
export WB_TOKEN=overload-$RANDOM$RANDOM
url=tcp://127.0.0.1:$((21000 + RANDOM % 11000)) # below the ephemeral ports (32768-)
cat >"$tmp/trainer.yaml" <<EOF
world_size: 32
gpus_per_node: 8
mesh:
  - {name: fsdp, size: 8}
  - {name: ep, size: 4}
placements:
  - match: "model.layers.{layer}.mlp.experts.{expert}.*"
    place: {fsdp: shard(0), ep: expert}
  - match: "*"
    place: {fsdp: shard(0), ep: shard(0)}
EOF
cat >"$tmp/rollout.yaml" <<EOF
replicas: 16
gpus_per_replica: 2
tp: 2
gpus_per_node: 8
EOF
cat >"$tmp/job.yaml" <<EOF
name: overload
listen: $url
model:
  rules: $root/configs/models/qwen3_moe.yaml
  hf_config: $root/configs/jobs/demo/config.json
trainer_layout: $tmp/trainer.yaml
rollout_layout: $tmp/rollout.yaml
mem_cap: 4MiB
provider: tcp
EOF
mkdir -p "$tmp/dump"
WB_LOG=info "$bin/wb-controller" --config "$tmp/job.yaml" >"$tmp/controller.log" 2>&1 &
pids+=($!)
for r in $(seq 0 31); do
    "$bin/wb-agent" --role trainer --rank "$r" --controller "$url" --tx-domain lo \
        >"$tmp/trainer$r.log" 2>&1 &
    pids+=($!)
    "$bin/wb-agent" --role rollout --rank "$r" --controller "$url" --tx-domain lo \
        --dump "$tmp/dump" --dump-from 3 >"$tmp/rollout$r.log" 2>&1 &
    pids+=($!)
done
ready=0
for _ in $(seq 1 600); do
    if "$bin/wb-ctl" -c "$url" --timeout 5s status 2>/dev/null | grep -q ': ready (gen'; then
        ready=1
        break
    fi
    sleep 0.2
done
[ $ready -eq 1 ] || fail "the job never became ready"
for v in 1 2 3; do
    out=$("$bin/wb-ctl" -c "$url" --timeout 300s transfer --version $v 2>&1) ||
        fail "transfer $v: $(head -n 3 <<<"$out")"
    grep -q "transfer $v: complete in" <<<"$out" || fail "transfer $v: $(head -n 3 <<<"$out")"
    echo "    $(grep -o "transfer $v: complete in [0-9.]* [a-z]*" <<<"$out")"
done
if grep -q ' is dead' "$tmp/controller.log"; then
    fail "an agent was declared dead: $(grep -m1 ' is dead' "$tmp/controller.log")"
fi
for _ in $(seq 1 100); do # the dumps are written on the rollouts' own threads
    [ "$(ls "$tmp/dump" | grep -c '\.v3\.bin$')" -eq 32 ] && break
    sleep 0.2
done
out=$("$bin/wb-ctl" verify --config "$tmp/job.yaml" --dump "$tmp/dump" --version 3 2>&1) ||
    fail "verify: $out"
grep -q "verify version 3: 32 rollouts, .* every byte equals the reference" <<<"$out" ||
    fail "verify: $out"
"$bin/wb-ctl" -c "$url" shutdown >/dev/null 2>&1
echo "ok $name"
echo "1 passed, 0 failed, 0 skipped"
