// The measuring tools run to the end: a tool that fails after its first round measures nothing.
import { execFile, execFileSync } from 'node:child_process'
import { fileURLToPath } from 'node:url'
import { promisify } from 'node:util'
import { describe, expect, it } from 'vitest'

const run = promisify(execFile)
const bench = fileURLToPath(new URL('..', import.meta.url))

describe('backend-cpu', () => {
  // Regression: every round after the first re-sent the floor's PREPAREs on the pool's connections, and Postgres
  // refused them (42P05, "prepared statement already exists").
  it('measures every variant over more than one round', async () => {
    const { stdout } = await run(
      process.execPath,
      [
        '--import',
        'tsx',
        'src/backend-cpu.ts',
        '--rounds',
        '2',
        '--transactions',
        '20',
        '--connections',
        '2',
      ],
      { cwd: bench, env: process.env, timeout: 120_000 },
    )
    for (const variant of ['sql-floor', 'oncely-lock', 'oncely-row'])
      expect(stdout).toMatch(new RegExp(`^${variant} +\\d+`, 'm'))
  }, 150_000)
})

const hasValgrind = (() => {
  try {
    execFileSync('valgrind', ['--version'], { stdio: 'ignore' })
    return true
  } catch {
    return false
  }
})()

describe('server-instructions', () => {
  it.skipIf(!hasValgrind)(
    'counts every variant it is given, split into its parts',
    async () => {
      const { stdout } = await run(
        process.execPath,
        [
          '--import',
          'tsx',
          'src/server-instructions.ts',
          '--variants',
          'sql-floor,oncely-lock',
          '--warm-up',
          '50',
          '--requests',
          '50',
          '--top',
          '5',
        ],
        { cwd: bench, env: process.env, timeout: 400_000 },
      )
      for (const variant of ['sql-floor', 'oncely-lock'])
        expect(stdout).toMatch(new RegExp(`^${variant} +[1-9][\\d.]* +[1-9][\\d.]* +[\\d.]+ +[\\d.]+$`, 'm'))
      expect(stdout).toMatch(/^oncely-lock over sql-floor, request path, by function/m)
    },
    450_000,
  )
})
