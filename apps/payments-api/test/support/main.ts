import { type ChildProcess, spawn } from 'node:child_process'
import path from 'node:path'
import { createInterface } from 'node:readline'

/** The demo's real entry point. */
export const MAIN = path.resolve(import.meta.dirname, '../../src/main.ts')

/** The entry point running as a child process, once it said it is ready. */
export interface Started {
  child: ChildProcess
  url: string
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>
  /** Everything it wrote to stdout and stderr so far (its log), to explain a failure. */
  output(): string
}

/** Starts `src/main.ts` on a free port with `env` over the test's environment; resolves once it is ready. */
export function startMain(env: Record<string, string>): Promise<Started> {
  const child = spawn(process.execPath, ['--conditions=@oncely/source', '--import', 'tsx', MAIN], {
    cwd: path.resolve(import.meta.dirname, '../..'),
    env: { ...process.env, PORT: '0', LOG_LEVEL: 'warn', ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  })
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
    child.once('exit', (code, signal) => resolve({ code, signal })),
  )
  let output = ''
  child.stderr!.on('data', (chunk) => {
    output += chunk
  })
  return new Promise((resolve, reject) => {
    createInterface({ input: child.stdout! }).on('line', (line) => {
      output += `${line}\n`
      const match = /ready at (http:\/\/\S+?)\/? /.exec(line)
      if (match) resolve({ child, url: match[1]!, exited, output: () => output })
    })
    void exited.then(({ code }) =>
      reject(new Error(`payments-api exited with ${code} before it was ready: ${output}`)),
    )
  })
}
