#!/usr/bin/env bash
# Start the pieces of a unit-tvm fleet: TVM's RPC tracker on one machine, a server on each
# device machine. Both run in the foreground until killed (run them under tmux, systemd, ...).
#
#   scripts/fleet/fleet.sh tracker [PORT]                     # default port 9190
#   scripts/fleet/fleet.sh server TRACKER_HOST:PORT KEY [--isa LEVEL] [--threads N]
#                                 [--custom-addr ADDR]        # the address the tracker hands out
#   scripts/fleet/fleet.sh status TRACKER_HOST:PORT           # servers and queues per key
#
# PYTHON (default: .venv/bin/python, else python3) must have unit-tvm installed (`make run` or
# `pip install -e .` on every machine): servers describe their CPU with it.
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
py=${PYTHON:-$([ -x "$here/.venv/bin/python" ] && echo "$here/.venv/bin/python" || echo python3)}
cmd=${1:-}
shift || true
case "$cmd" in
  tracker)
    port=${1:-9190}
    exec "$py" -m tvm.exec.rpc_tracker --host 0.0.0.0 --port "$port" --port-end $((port + 1)) ;;
  server)
    [ $# -ge 2 ] || { echo "usage: $0 server TRACKER_HOST:PORT KEY [options]" >&2; exit 2; }
    tracker=$1 key=$2
    shift 2
    exec "$py" -m unit_tvm.fleet.server --tracker "$tracker" --key "$key" "$@" ;;
  status)
    [ $# -ge 1 ] || { echo "usage: $0 status TRACKER_HOST:PORT" >&2; exit 2; }
    exec "$py" -m tvm.exec.query_rpc_tracker --host "${1%:*}" --port "${1##*:}" ;;
  *)
    sed -n '2,12p' "$0" >&2
    exit 2 ;;
esac
