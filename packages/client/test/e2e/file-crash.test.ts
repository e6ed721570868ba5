import { mkdtemp, rm } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { spawnTsx } from '@oncely/test-support'
import { afterAll, expect, it } from 'vitest'
import { fileStore } from '../../src/stores/node.js'

const dirs: string[] = []
afterAll(async () => {
  for (const dir of dirs) await rm(dir, { recursive: true, force: true })
})

it('a process SIGKILLed in the middle of rewriting an intent leaves a whole record, never a torn one', async () => {
  for (let round = 0; round < 3; round++) {
    const dir = await mkdtemp(join(tmpdir(), 'oncely-crash-'))
    dirs.push(dir)
    const child = spawnTsx(new URL('./fixtures/write-loop.ts', import.meta.url), [dir], {
      cwd: fileURLToPath(new URL('../..', import.meta.url)),
      stdio: ['ignore', 'pipe', 'inherit'],
    })
    await new Promise<void>((resolve) => child.stdout.once('data', () => resolve()))
    await new Promise((resolve) => setTimeout(resolve, 50 + round * 70))
    child.kill('SIGKILL')
    await new Promise((resolve) => child.once('exit', resolve))

    const store = fileStore({ dir })
    const quarantined: unknown[] = []
    store.attach?.((event, payload) => {
      if (event === 'quarantined') quarantined.push(payload)
    })
    const records = await store.list()
    expect(records).toHaveLength(1)
    expect(records[0]).toMatchObject({ id: 'crash-me', key: 'crash-key' })
    expect(records[0]!.body!.data).toHaveLength(64 * 1024)
    expect(records[0]!.attempts).toBeGreaterThan(1)
    expect(quarantined).toEqual([])
  }
})
