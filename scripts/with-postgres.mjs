#!/usr/bin/env node
// Runs a command with DATABASE_URL pointing at a real Postgres.
//
// DATABASE_URL set: the command runs as is. Unset: a throwaway embedded Postgres is started in its own process
// (see pg-server.mjs), the command runs with DATABASE_URL pointing at it, and Postgres is stopped afterwards.
// The exit code is always the command's own.
import { spawn } from 'node:child_process'
import { mkdtempSync, rmSync } from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import { createInterface } from 'node:readline'
import { fileURLToPath } from 'node:url'

const [command, ...args] = process.argv.slice(2)
if (!command) {
  console.error('usage: node scripts/with-postgres.mjs <command> [args...]')
  process.exit(2)
}

function run(env) {
  return new Promise((resolve) => {
    const child = spawn(command, args, { stdio: 'inherit', env, shell: process.platform === 'win32' })
    const forward = (signal) => child.kill(signal)
    process.on('SIGINT', forward)
    process.on('SIGTERM', forward)
    child.on('exit', (code, signal) => resolve(code ?? (signal ? 1 : 0)))
    child.on('error', (error) => {
      console.error(`with-postgres: could not run ${command}: ${error.message}`)
      resolve(127)
    })
  })
}

if (process.env.DATABASE_URL) {
  process.exit(await run(process.env))
}

const here = path.dirname(fileURLToPath(import.meta.url))
const dir = mkdtempSync(path.join(os.tmpdir(), 'oncely-pg-'))
// The cluster runs as the `postgres` OS user when we are root; it must be able to enter the directory.
if (process.getuid?.() === 0) (await import('node:fs')).chmodSync(dir, 0o777)
const server = spawn(process.execPath, [path.join(here, 'pg-server.mjs'), '--dir', path.join(dir, 'data')], {
  stdio: ['pipe', 'pipe', 'inherit'],
})
const url = await new Promise((resolve) => {
  const lines = createInterface({ input: server.stdout })
  lines.on('line', (line) => {
    if (line.startsWith('READY ')) resolve(line.slice(6))
  })
  server.on('exit', () => resolve(null))
})
if (!url) {
  console.error('with-postgres: the embedded Postgres did not start (set DATABASE_URL to use another server)')
  process.exit(1)
}
console.log(`with-postgres: DATABASE_URL unset, started an embedded Postgres for this run (${url})`)

const code = await run({ ...process.env, DATABASE_URL: url })
const stopped = new Promise((resolve) => server.on('exit', resolve))
server.kill('SIGTERM')
await stopped
rmSync(dir, { recursive: true, force: true })
process.exit(code)
