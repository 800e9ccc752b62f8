// Runs a wasm32-wasip1 test binary under Node's WASI, so the pure core is
// tested as the 32-bit wasm that Envoy loads. The proxy-wasm host functions
// the filter imports are stubbed to trap: a core test that reaches one is a
// test of glue, not of the core, and must fail loudly.
// Cargo calls it as the target runner: node wasm-runner.mjs <test.wasm> [args…]
import { readFile } from 'node:fs/promises';
import { WASI } from 'node:wasi';
import process from 'node:process';

const [file, ...args] = process.argv.slice(2);
const wasi = new WASI({
  version: 'preview1',
  args: [file, ...args],
  env: process.env,
  preopens: { '.': '.' },
  returnOnExit: true,
});
const module = await WebAssembly.compile(await readFile(file));
const imports = { wasi_snapshot_preview1: wasi.wasiImport };
for (const imp of WebAssembly.Module.imports(module)) {
  if (imp.module === 'wasi_snapshot_preview1' || imp.kind !== 'function') continue;
  imports[imp.module] ??= {};
  imports[imp.module][imp.name] = () => {
    throw new Error(`host function ${imp.module}.${imp.name} called from a core test`);
  };
}
const instance = await WebAssembly.instantiate(module, imports);
process.exitCode = wasi.start(instance);
