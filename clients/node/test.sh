#!/usr/bin/env bash
# Tests of the Node client against real Palisade processes. From the
# repository root: bash clients/node/test.sh [node --test args…]
# Needs node (>= 18) and npm, and the palisade binary ($PALISADE_BIN, default
# target/debug/palisade). index.d.ts is type-checked with tsc when it can be
# had: typescript and @types/node are installed once into
# ${PALISADE_NODE_TOOLS:-$HOME/.cache/palisade/node-tools} (outside the
# repository); without them (no registry) that step is skipped. Nothing is
# written into the repository.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
cd "$root"

export PALISADE_BIN=${PALISADE_BIN:-target/debug/palisade}
bin=$PALISADE_BIN
case $bin in /*) ;; *) bin=$root/$bin ;; esac
[ -x "$bin" ] || { echo "no palisade binary at $bin (set PALISADE_BIN)" >&2; exit 1; }
node -e 'process.exit(Number(process.versions.node.split(".")[0]) >= 18 ? 0 : 1)' \
  || { echo "node >= 18 needed, this is $(node --version)" >&2; exit 1; }

tools=${PALISADE_NODE_TOOLS:-$HOME/.cache/palisade/node-tools}
tmp=$(mktemp -d)
node_pid=""
cleanup() {
  if [ -n "$node_pid" ]; then kill -9 "$node_pid" 2>/dev/null || true; wait "$node_pid" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT

# -- index.d.ts, type-checked ---------------------------------------------
if [ ! -x "$tools/node_modules/.bin/tsc" ] || [ ! -d "$tools/node_modules/@types/node" ]; then
  mkdir -p "$tools"
  npm install --prefix "$tools" --no-audit --no-fund --silent typescript@5 @types/node@20 >/dev/null 2>&1 || true
fi
if [ -x "$tools/node_modules/.bin/tsc" ] && [ -d "$tools/node_modules/@types/node" ]; then
  cat > "$tmp/tsconfig.json" <<JSON
{
  "compilerOptions": {
    "strict": true, "noEmit": true, "target": "es2022", "module": "commonjs",
    "moduleResolution": "node", "lib": ["es2022"], "types": ["node"],
    "typeRoots": ["$tools/node_modules/@types"], "baseUrl": "$here",
    "paths": { "palisade": ["$here/index.d.ts"] }
  },
  "files": ["$here/index.d.ts", "$here/test/types.ts"]
}
JSON
  echo "tsc --strict (index.d.ts, test/types.ts): $("$tools/node_modules/.bin/tsc" --version)"
  "$tools/node_modules/.bin/tsc" -p "$tmp/tsconfig.json"
else
  echo "tsc: skipped (typescript could not be installed into $tools)"
fi

# -- the package as npm installs it --------------------------------------------
echo "npm pack + npm install into $tmp/app:"
tarball=$(cd "$here" && npm pack --silent --pack-destination "$tmp")
tar tzf "$tmp/$tarball" | sed 's|^package/||' | sort > "$tmp/files"
for f in package.json index.js index.d.ts README.md lib/client.js lib/connector.js lib/errors.js lib/models.js \
         examples/print-token.js examples/fenced-write.js examples/bench.js; do
  grep -qx "$f" "$tmp/files" || { echo "the package lacks $f" >&2; cat "$tmp/files" >&2; exit 1; }
done
if grep -E '^(test|test-support)/' "$tmp/files" >/dev/null; then echo "the package carries its tests" >&2; exit 1; fi
mkdir "$tmp/app"
(cd "$tmp/app" && npm init -y >/dev/null && npm install --no-audit --no-fund --silent "$tmp/$tarball" >/dev/null)
port=$(node -e 'const s=require("net").createServer().listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})')
peer=$(node -e 'const s=require("net").createServer().listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})')
"$bin" serve --id 1 --listen "127.0.0.1:$port" --listen-peer "127.0.0.1:$peer" --data-dir "$tmp/data" > "$tmp/node.log" 2>&1 &
node_pid=$!
for _ in $(seq 1 1200); do
  grep -q "serving clients on" "$tmp/node.log" && break
  kill -0 "$node_pid" 2>/dev/null || { cat "$tmp/node.log" >&2; exit 1; }
  sleep 0.05
done
grep -q "serving clients on" "$tmp/node.log" || { echo "node not ready:" >&2; cat "$tmp/node.log" >&2; exit 1; }
out=$(cd "$tmp/app" && PALISADE_ENDPOINTS="127.0.0.1:$port" node node_modules/palisade/examples/print-token.js)
echo "  installed examples/print-token.js: $out"
[[ $out =~ ^holding\ jobs/nightly\ with\ fencing\ token\ [0-9]+$ ]] || { echo "unexpected output" >&2; exit 1; }
(cd "$tmp/app" && node -e '
  const p = require("palisade");
  if (typeof p.Client !== "function" || !(new p.WouldBlock() instanceof p.PalisadeError)) process.exit(1);
  console.log("  require(\"palisade\") " + p.version + " from " + require.resolve("palisade"));
')
kill -9 "$node_pid"; wait "$node_pid" 2>/dev/null || true; node_pid=""

# -- the tests ------------------------------------------------------------------
echo "node --test (PALISADE_BIN=$PALISADE_BIN):"
concurrency=()
if node --help | grep -q -- '--test-concurrency'; then concurrency=(--test-concurrency=8); fi
node --test "${concurrency[@]}" "$@" "$here/test/"
