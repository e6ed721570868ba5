import { describe, expect, it } from 'vitest'
import { startNemesis } from '../src/nemesis.js'
import { createRandom } from '../src/random.js'

describe('startNemesis', () => {
  it('injects each enabled kind once first, keeps going after a failed fault, and stops cleanly', async () => {
    const done: string[] = []
    const errors: unknown[] = []
    const nemesis = startNemesis({
      random: createRandom(1),
      faults: [
        'drop-request',
        'kill-db-connections',
        'pause-server',
        'restart-db',
        'failover',
        'saturate-pool',
      ],
      pauseMs: 5,
      meanIntervalMs: 10,
      onError: (error) => errors.push(error),
      actions: {
        pauseServer: async () => void done.push('pause-server'),
        restartDb: async () => {
          done.push('restart-db')
          throw new Error('database is down')
        },
        killDbConnections: async () => void done.push('kill-db-connections'),
        failover: async () => void done.push('failover'),
        saturatePool: async () => void done.push('saturate-pool'),
        restartWorker: async () => expect.fail('not enabled'),
        killWorkerConnections: async () => expect.fail('not enabled'),
        restartPooler: async () => expect.fail('not enabled'),
      },
    })
    for (let i = 0; i < 100 && done.length < 8; i++) await new Promise((r) => setTimeout(r, 10))
    await nemesis.stop()
    expect(done.slice(0, 5).sort()).toEqual([
      'failover',
      'kill-db-connections',
      'pause-server',
      'restart-db',
      'saturate-pool',
    ])
    expect(done.length).toBeGreaterThanOrEqual(8)
    expect(errors.length).toBe(done.filter((d) => d === 'restart-db').length)
    const count = done.length
    await new Promise((r) => setTimeout(r, 50))
    expect(done.length).toBe(count)
  })

  it('tries a first-pass kind again later when it could not happen then', async () => {
    const done: string[] = []
    let serversDown = 2
    const nemesis = startNemesis({
      random: createRandom(2),
      faults: ['pause-server', 'kill-db-connections'],
      pauseMs: 5,
      meanIntervalMs: 10,
      actions: {
        pauseServer: async () => {
          if (serversDown-- > 0) return false
          done.push('pause-server')
        },
        restartDb: async () => expect.fail('not enabled'),
        failover: async () => expect.fail('not enabled'),
        saturatePool: async () => expect.fail('not enabled'),
        restartWorker: async () => expect.fail('not enabled'),
        killWorkerConnections: async () => expect.fail('not enabled'),
        restartPooler: async () => expect.fail('not enabled'),
        killDbConnections: async () => void done.push('kill-db-connections'),
      },
    })
    for (let i = 0; i < 200 && !done.includes('pause-server'); i++)
      await new Promise((r) => setTimeout(r, 10))
    await nemesis.stop()
    // The first pass ends with the pause, after two refusals, before any seeded pick can repeat a kind.
    expect(done.indexOf('pause-server')).toBe(1)
    expect(done[0]).toBe('kill-db-connections')
  })

  it('restarts the pooler when it is enabled', async () => {
    const done: string[] = []
    const nemesis = startNemesis({
      random: createRandom(4),
      faults: ['restart-pooler'],
      pauseMs: 5,
      meanIntervalMs: 10,
      actions: {
        pauseServer: async () => expect.fail('not enabled'),
        restartDb: async () => expect.fail('not enabled'),
        killDbConnections: async () => expect.fail('not enabled'),
        failover: async () => expect.fail('not enabled'),
        saturatePool: async () => expect.fail('not enabled'),
        restartWorker: async () => expect.fail('not enabled'),
        killWorkerConnections: async () => expect.fail('not enabled'),
        restartPooler: async () => void done.push('restart-pooler'),
      },
    })
    for (let i = 0; i < 100 && done.length < 2; i++) await new Promise((r) => setTimeout(r, 10))
    await nemesis.stop()
    expect(done.slice(0, 2)).toEqual(['restart-pooler', 'restart-pooler'])
  })

  it("injects a Citus cluster's worker faults when they are enabled", async () => {
    const done: string[] = []
    const nemesis = startNemesis({
      random: createRandom(3),
      faults: ['restart-worker', 'kill-worker-connections'],
      pauseMs: 5,
      meanIntervalMs: 10,
      actions: {
        pauseServer: async () => expect.fail('not enabled'),
        restartDb: async () => expect.fail('not enabled'),
        killDbConnections: async () => expect.fail('not enabled'),
        failover: async () => expect.fail('not enabled'),
        saturatePool: async () => expect.fail('not enabled'),
        restartWorker: async () => void done.push('restart-worker'),
        killWorkerConnections: async () => void done.push('kill-worker-connections'),
        restartPooler: async () => expect.fail('not enabled'),
      },
    })
    for (let i = 0; i < 100 && done.length < 2; i++) await new Promise((r) => setTimeout(r, 10))
    await nemesis.stop()
    expect(done.slice(0, 2).sort()).toEqual(['kill-worker-connections', 'restart-worker'])
  })

  it('does nothing when no nemesis fault is enabled', async () => {
    const nemesis = startNemesis({
      random: createRandom(1),
      faults: ['drop-request'],
      pauseMs: 5,
      actions: {
        pauseServer: async () => expect.fail('no pause expected'),
        restartDb: async () => expect.fail('no restart expected'),
        killDbConnections: async () => expect.fail('no kill expected'),
        failover: async () => expect.fail('no failover expected'),
        saturatePool: async () => expect.fail('no burst expected'),
        restartWorker: async () => expect.fail('no worker restart expected'),
        killWorkerConnections: async () => expect.fail('no worker kill expected'),
        restartPooler: async () => expect.fail('not enabled'),
      },
    })
    await nemesis.stop()
  })
})
