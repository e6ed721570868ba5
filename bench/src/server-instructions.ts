// What a first execution costs the bench server process, counted in instructions rather than timed: each variant's
// server (bench/src/server/main.ts, alone) runs under callgrind (valgrind) and serves `--warm-up` first executions
// at 10 connections, uncounted; then callgrind counts every thread of the process over `--requests` more. The
// instructions are split into what the request path itself runs (the JIT's code, V8's builtins and runtime, Node's
// C++ and libc: "request path") and the two parts a window of a few thousand requests catches unevenly, the
// collector and the optimizing compiler, which run in bursts (a major collection falls in one window and not the
// next). The request path is the part a change to the engine or an adapter moves, and it repeats to 1% to 3% between
// runs whatever else the machine does (throughput on this shared machine moves by 10% and more between blocks).
// It does not see what instructions do not count: cache misses, system calls, the kernel's loopback TCP. And a server
// under callgrind answers about 70 requests a second, so work done on a timer (the replay cache's replication check,
// at most every 100 ms) falls on one request in 7 there, against one in 250 at full speed: it is overstated.
//
//   DATABASE_URL=postgres://postgres@127.0.0.1:5432/test pnpm --filter @oncely/bench server-instructions -- \
//     [--variants sql-floor,oncely-lock] [--warm-up 4000] [--requests 4000] [--top 30]
//
// Needs valgrind (Debian: apt-get install valgrind); each variant takes a few minutes. It runs the built packages, as
// the bench server does: `pnpm turbo run build --filter=./packages/*` after a change.
import { execFileSync } from 'node:child_process'
import { randomUUID } from 'node:crypto'
import { mkdtempSync, readdirSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { parseArgs } from 'node:util'
import { createTestDatabase } from '@oncely/test-support'
import { keySequence, load } from './load.js'
import { LEDGER_SCHEMA } from './server/ledger.js'
import { startServer } from './server/process.js'
import { REGISTRY } from './server/registry.js'

const { values } = parseArgs({
  args: process.argv.slice(2).filter((arg) => arg !== '--'),
  options: {
    variants: { type: 'string', default: 'sql-floor,oncely-lock' },
    'warm-up': { type: 'string', default: '4000' },
    requests: { type: 'string', default: '4000' },
    top: { type: 'string', default: '30' },
  },
})
const variants = values.variants.split(',')
for (const name of variants)
  if (!REGISTRY[name]) throw new Error(`unknown variant ${name} (known: ${Object.keys(REGISTRY).join(', ')})`)
const warmUp = Number(values['warm-up'])
const requests = Number(values.requests)
const top = Number(values.top)
if (!(requests > 0) || !(warmUp >= 0))
  throw new Error('--requests must be positive and --warm-up not negative')
try {
  execFileSync('valgrind', ['--version'])
} catch {
  throw new Error('server-instructions needs valgrind (Debian: apt-get install valgrind)')
}

/** Where an instruction was spent, from the symbol callgrind names (V8's C++ symbols name their subsystem). */
type Part = 'request path' | 'collector' | 'compiler'
const COLLECTOR =
  /Marking|Scaveng|Sweep|Evacuat|MarkCompact|RememberedSet|SlotSet|GCTracer|MinorMS|ActiveSystemPages|MemoryChunk|WeakObjects|heap::base::|Pretenuring|NewSpace|PagedSpace|MemoryAllocator|RelocIterator|RecordMigrated|IteratePointers|BodyDescriptorApply|v8::internal::Heap::/
const COMPILER =
  /compiler::|maglev::|turboshaft::|Turboshaft|Maglev|baseline::|OptimizingCompile|CompileLazy|v8::internal::(Parser|ParserBase|Scanner|Compiler|Zone|AstNode|interpreter::)/
const partOf = (symbol: string): Part =>
  COMPILER.test(symbol) ? 'compiler' : COLLECTOR.test(symbol) ? 'collector' : 'request path'

/** Self instructions per function of one callgrind dump, by `callgrind_annotate` (machine code of the JIT as "JIT"). */
function functionsOf(file: string): Map<string, number> {
  const out = execFileSync('callgrind_annotate', ['--inclusive=no', '--threshold=100', file], {
    maxBuffer: 256 * 1024 * 1024,
  }).toString()
  const functions = new Map<string, number>()
  for (const line of out.split('\n')) {
    const match = /^\s*([\d,]+)\s+\([\s\d.]+%\)\s+(.*)$/.exec(line)
    if (!match || line.includes('PROGRAM TOTALS')) continue
    let symbol = match[2]!.replace(/\s*\[[^\]]*\]$/, '').replace(/^\?\?\?:/, '')
    if (symbol.startsWith('0x')) symbol = 'JIT'
    functions.set(symbol, (functions.get(symbol) ?? 0) + Number(match[1]!.replaceAll(',', '')))
  }
  return functions
}

const db = await createTestDatabase('server_instructions', { max: 2 })
await db.pool.query(LEDGER_SCHEMA)
const dumps = mkdtempSync(path.join(tmpdir(), 'oncely-server-instructions-'))

/** Instructions of every thread of `variant`'s server process over `requests` first executions, per function. */
async function countOne(variant: string): Promise<Map<string, number>> {
  const tag = `${variant}-${randomUUID()}`
  const server = await startServer({
    databaseUrl: db.url,
    redisUrl: process.env.REDIS_URL ?? 'redis://127.0.0.1:6379',
    poolSize: 10,
    variants: [variant],
    launcher: [
      'valgrind',
      '--tool=callgrind',
      '--quiet',
      `--callgrind-out-file=${dumps}/${tag}.%p`,
      // V8 writes and rewrites machine code: valgrind must notice code changing in memory it did not load.
      '--smc-check=all-non-file',
      '--instr-atstart=no',
    ],
  })
  try {
    const url = server.urls[variant]
    if (!url) throw new Error(`${variant} did not start: ${server.failed[variant]}`)
    const run = async (amount: number, label: string) => {
      const result = await load({ url, connections: 10, amount, nextKey: keySequence(`${tag}-${label}`) })
      const bad = result.errors + Object.entries(result.statuses).filter(([s]) => s !== '201').length
      if (bad > 0)
        throw new Error(`${variant}: not every answer was a 201 (${JSON.stringify(result.statuses)})`)
    }
    if (warmUp > 0) await run(warmUp, 'warm-up')
    const pid = String(server.pid)
    execFileSync('callgrind_control', ['--instr=on', pid], { stdio: 'ignore' })
    await run(requests, 'counted')
    execFileSync('callgrind_control', ['--dump', pid], { stdio: 'ignore' })
    execFileSync('callgrind_control', ['--instr=off', pid], { stdio: 'ignore' })
    // The dump taken on request is the file with a part number; the one written at exit counts nothing after it.
    const dump = readdirSync(dumps).find((file) => file.startsWith(tag) && /\.\d+\.\d+$/.test(file))
    if (!dump) throw new Error(`callgrind wrote no dump for ${variant}`)
    return functionsOf(path.join(dumps, dump))
  } finally {
    await server.stop()
  }
}

// Keyed by label: a variant named twice is counted twice (`oncely-lock`, `oncely-lock#2`), which shows how well
// the counts repeat.
const counted = new Map<string, Map<string, number>>()
for (const variant of variants) {
  console.error(
    `${variant}: ${warmUp} first executions to warm up, then ${requests} counted, under callgrind`,
  )
  let label = variant
  for (let n = 2; counted.has(label); n++) label = `${variant}#${n}`
  counted.set(label, await countOne(variant))
}
await db.drop()
rmSync(dumps, { recursive: true, force: true })

const perRequest = (n: number) => (n / requests / 1000).toFixed(1).padStart(9)
console.log('\nthousands of instructions per first execution, every thread of the server process')
console.log(
  `${'variant'.padEnd(28)}${'total'.padStart(9)}${'request path'.padStart(14)}${'collector'.padStart(11)}${'compiler'.padStart(10)}`,
)
for (const [variant, functions] of counted) {
  const parts: Record<Part, number> = { 'request path': 0, collector: 0, compiler: 0 }
  let total = 0
  for (const [symbol, n] of functions) {
    parts[partOf(symbol)] += n
    total += n
  }
  console.log(
    `${variant.padEnd(28)}${perRequest(total)}${perRequest(parts['request path']).padStart(14)}${perRequest(parts.collector).padStart(11)}${perRequest(parts.compiler).padStart(10)}`,
  )
}
const [first, ...others] = counted.keys()
for (const other of others) {
  const a = counted.get(other)!
  const b = counted.get(first!)!
  const rows = [...new Set([...a.keys(), ...b.keys()])]
    .filter((symbol) => partOf(symbol) === 'request path')
    .map((symbol) => ({ symbol, delta: (a.get(symbol) ?? 0) - (b.get(symbol) ?? 0) }))
    .sort((x, y) => Math.abs(y.delta) - Math.abs(x.delta))
    .slice(0, top)
  console.log(`\n${other} over ${first}, request path, by function (thousands per first execution):`)
  for (const { symbol, delta } of rows)
    console.log(`${(delta / requests / 1000).toFixed(2).padStart(8)}  ${symbol.slice(0, 140)}`)
}
