// A fixture program in a real child process (run from source through tsx), and waiting for what it or the server
// reports: shared by the end-to-end tests that SIGKILL a client program and run the next one.
import { type ChildProcess, spawn } from 'node:child_process'
import { fileURLToPath } from 'node:url'

const packageDir = fileURLToPath(new URL('../../..', import.meta.url))

/** A running fixture: its process, the JSON lines it printed so far, and how it ended (`signal` when killed). */
export interface Child {
  proc: ChildProcess
  lines: Record<string, unknown>[]
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>
}

/** Runs `fixture` (a path) with `args`; its stdout must be one JSON object a line. */
export function runFixture(fixture: string, args: string[]): Child {
  const proc = spawn(process.execPath, ['--conditions=@oncely/source', '--import', 'tsx', fixture, ...args], {
    cwd: packageDir,
    stdio: ['ignore', 'pipe', 'pipe'],
  })
  const lines: Record<string, unknown>[] = []
  let buffer = ''
  proc.stdout!.on('data', (chunk: Buffer) => {
    buffer += chunk.toString()
    for (let newline = buffer.indexOf('\n'); newline >= 0; newline = buffer.indexOf('\n')) {
      lines.push(JSON.parse(buffer.slice(0, newline)) as Record<string, unknown>)
      buffer = buffer.slice(newline + 1)
    }
  })
  proc.stderr!.on('data', (chunk: Buffer) => process.stderr.write(chunk))
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
    proc.on('exit', (code, signal) => resolve({ code, signal })),
  )
  return { proc, lines, exited }
}

/** Polls `check` until it holds; fails naming `what` after `timeoutMs` (a bound on a hang, not a timed assertion). */
export async function until(check: () => boolean, what: string, timeoutMs = 30_000): Promise<void> {
  const deadline = Date.now() + timeoutMs
  while (!check()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`)
    await new Promise((resolve) => setTimeout(resolve, 20))
  }
}
