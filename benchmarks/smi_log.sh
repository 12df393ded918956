#!/usr/bin/env bash
# SM clock, memory clock, board power, temperature and clock-event reasons every PERIOD ms into FILE,
# until killed (run it in the background). Older drivers name the reasons field clocks_throttle_*.
# Usage: bash benchmarks/smi_log.sh FILE PERIOD_MS &
fields=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active
nvidia-smi --query-gpu=$fields --format=csv,noheader > /dev/null 2>&1 || fields=${fields/clocks_event/clocks_throttle}
exec nvidia-smi --query-gpu=$fields --format=csv,noheader -lms "${2:-100}" > "${1:?file}" 2>&1
