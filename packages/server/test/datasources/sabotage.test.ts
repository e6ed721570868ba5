// The datasource contract can see the window it guards: run with the writes going through a second connection of
// the same library (what a handler that forgot `ctx.tx` does), it must fail, under every datasource of the registry.
// Runs the suite in a child vitest per datasource.
import { spawn } from 'node:child_process'
import { fileURLToPath } from 'node:url'
import { expect, it } from 'vitest'
import { datasources, oneConnection } from './registry.js'

for (const name of Object.keys(datasources)) {
  it(`the datasource contract on ${name} fails when the handler writes through a second connection`, async () => {
    const cwd = fileURLToPath(new URL('../..', import.meta.url))
    // node-postgres runs the contract in the protocols' own projects; every other datasource in "<protocol> on <name>".
    const project = name === 'node-postgres' ? 'lock' : `lock on ${name}`
    const child = spawn('npx', ['vitest', 'run', 'test/datasources/contract.test.ts', '--project', project], {
      cwd,
      env: { ...process.env, ONCELY_TEST_SABOTAGE: 'second-connection', FORCE_COLOR: '0' },
    })
    let output = ''
    child.stdout.on('data', (chunk) => {
      output += chunk
    })
    child.stderr.on('data', (chunk) => {
      output += chunk
    })
    const code = await new Promise<number | null>((resolve) => child.once('exit', resolve))
    expect(code, output).not.toBe(0)
    // The cases that see the window fail: a write that must roll back with the attempt stays committed.
    expect(output).toMatch(/FAIL[^\n]*a handler that writes and throws leaves no row and a retryable key/)
    // One connection leaves the SIGKILL case out (contract.test.ts says why).
    if (!oneConnection.has(name))
      expect(output).toMatch(/FAIL[^\n]*a process SIGKILLed mid-handler leaves no partial write/)
  }, 120_000)
}
