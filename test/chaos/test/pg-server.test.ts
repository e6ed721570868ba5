/**
 * scripts/pg-server.mjs and its port: Postgres cannot bind port 0 and report it, so the script picks one itself and
 * names it on its READY line; a restart that must keep its port waits while another process holds it instead of
 * failing with "Address already in use".
 */
import { type ChildProcess, spawn } from 'node:child_process'
import { chmodSync, mkdtempSync, rmSync } from 'node:fs'
import { createServer, type Server } from 'node:net'
import { tmpdir } from 'node:os'
import { join, resolve } from 'node:path'
import { createInterface } from 'node:readline'
import { afterAll, expect, it } from 'vitest'

const SCRIPT = resolve(import.meta.dirname, '../../../scripts/pg-server.mjs')
const dir = mkdtempSync(join(tmpdir(), 'oncely-pg-server-'))
chmodSync(dir, 0o755) // as root, the server runs as the `postgres` OS user
const children: ChildProcess[] = []
afterAll(async () => {
  for (const child of children) {
    if (child.exitCode !== null || child.signalCode !== null) continue
    const exited = new Promise((r) => child.once('exit', r))
    child.kill('SIGTERM')
    await exited
  }
  rmSync(dir, { recursive: true, force: true })
})

/** Starts pg-server: `ready` resolves with its READY url; `stderr()` is what it wrote there so far. */
function start(args: string[]): { ready: Promise<string>; stderr: () => string; exited: () => boolean } {
  const child = spawn(process.execPath, [SCRIPT, ...args], { stdio: ['pipe', 'pipe', 'pipe'] })
  children.push(child)
  let stderr = ''
  child.stderr!.on('data', (chunk) => {
    stderr += chunk
  })
  const ready = new Promise<string>((resolve, reject) => {
    createInterface({ input: child.stdout! }).on('line', (line) => {
      if (line.startsWith('READY ')) resolve(line.slice(6))
    })
    child.once('exit', (code) => reject(new Error(`pg-server exited with ${code}: ${stderr}`)))
  })
  return { ready, stderr: () => stderr, exited: () => child.exitCode !== null || child.signalCode !== null }
}

it('waits for a port another process holds (a restart keeps its port), then starts on it', async () => {
  const holder: Server = createServer()
  await new Promise<void>((r) => holder.listen(0, '127.0.0.1', r))
  const port = (holder.address() as { port: number }).port
  const server = start(['--dir', join(dir, 'data'), '--port', String(port)])
  server.ready.catch(() => {})
  // Released once the script has met the port in use (it says so), not after a guessed delay.
  const deadline = Date.now() + 120_000
  while (!server.stderr().includes(`port ${port} is in use`) && !server.exited() && Date.now() < deadline)
    await new Promise((r) => setTimeout(r, 100))
  expect(server.stderr()).toContain(`port ${port} is in use, waiting for it`)
  await new Promise((r) => holder.close(r))
  expect(new URL(await server.ready).port).toBe(String(port))
}, 180_000)

it('without --port, names the port it bound on its READY line', async () => {
  const url = await start(['--dir', join(dir, 'other')]).ready
  expect(Number(new URL(url).port)).toBeGreaterThan(0)
}, 180_000)
