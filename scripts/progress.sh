# Progress of the set-up scripts, on stderr (sourced by scripts/*.sh), as specula's own commands
# show theirs (src/common/progress.h): on a terminal one bar redrawn in place, with rate and ETA;
# otherwise one line per step, so CI logs stay readable. SPECULA_QUIET=1 prints no progress
# (errors and warnings still reach stderr).

# progress_start NAME TOTAL UNIT [--lines]: a task of TOTAL units (steps, %, MB) starts now.
# --lines: on a terminal too, each step's bar stays on its own line (for phases whose commands
# print, or draw bars, of their own in between); such phases differ in length, so no rate or ETA.
progress_start() {
  _progress_name="$1" _progress_total="$2" _progress_unit="$3" _progress_t0="$(date +%s)"
  _progress_lines=0
  [ "${4:-}" = --lines ] && _progress_lines=1
  return 0
}

# progress_step DONE LABEL: DONE of TOTAL units are done; LABEL says what runs now.
progress_step() {
  [ "${SPECULA_QUIET:-0}" = 1 ] && return 0
  local done="$1" label="$2" elapsed rate eta=""
  elapsed=$(($(date +%s) - _progress_t0))
  rate=$(awk -v d="$done" -v e="$elapsed" 'BEGIN { printf (e > 0 ? "%.1f" : "-"), (e > 0 ? d / e : 0) }')
  if [ "$_progress_lines" = 0 ] && [ "$done" -gt 0 ] && [ "$done" -lt "$_progress_total" ]; then
    eta=", ETA $((elapsed * (_progress_total - done) / done)) s"
  fi
  if [ -t 2 ]; then
    local width=30 fill bar
    fill=$((done * width / (_progress_total > 0 ? _progress_total : 1)))
    bar="$(printf '%*s' "$fill" '' | tr ' ' '#')$(printf '%*s' $((width - fill)) '')"
    local speed=""
    [ "$_progress_lines" = 1 ] || speed=", $rate $_progress_unit/s"
    printf '\r\033[K%s [%s] %s/%s %s%s%s  %.40s' "$_progress_name" "$bar" "$done" "$_progress_total" \
      "$_progress_unit" "$speed" "$eta" "$label" >&2
    if [ "$done" -ge "$_progress_total" ] || [ "$_progress_lines" = 1 ]; then echo >&2; fi
  else
    echo "$_progress_name: [$done/$_progress_total $_progress_unit] $label (${elapsed} s$eta)" >&2
  fi
  return 0
}

# progress_cmake NAME: reads a cmake build's output on stdin. Its progress lines, Make's "[ NN%] ..."
# or Ninja's "[n/N] ...", drive the bar on a terminal (and pass through as they are otherwise);
# every other line (warnings, errors, test output) is printed as it comes.
progress_cmake() {
  local line pct label tty=0
  [ -t 2 ] && tty=1
  progress_start "$1" 100 "%"
  while IFS= read -r line; do
    pct=""
    if [[ "$line" =~ ^\[\ *([0-9]+)%\]\ (.*)$ ]]; then
      pct="${BASH_REMATCH[1]}" label="${BASH_REMATCH[2]}"
    elif [[ "$line" =~ ^\[([0-9]+)/([1-9][0-9]*)\]\ (.*)$ ]]; then
      pct=$((BASH_REMATCH[1] * 100 / BASH_REMATCH[2])) label="${BASH_REMATCH[3]}"
    fi
    if [ -n "$pct" ]; then
      if [ $tty -eq 1 ]; then
        progress_step "$pct" "$label"
      elif [ "${SPECULA_QUIET:-0}" != 1 ]; then
        echo "$line"
      fi
    else
      [ $tty -eq 1 ] && [ "${SPECULA_QUIET:-0}" != 1 ] && printf '\r\033[K' >&2
      echo "$line"
    fi
  done
  [ $tty -eq 1 ] && [ "${SPECULA_QUIET:-0}" != 1 ] && printf '\r\033[K' >&2
  return 0
}
