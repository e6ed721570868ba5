import { describe, expect, it } from 'vitest'
import type { HistoryEvent, IntentKind, NewEvent } from '../src/history.js'
import { IntentTracker } from '../src/in-flight.js'

function tracker() {
  const t = new IntentTracker()
  let index = 0
  const feed = (event: NewEvent) => t.observe({ ...event, index: ++index, time: index } as HistoryEvent)
  const invoke = (intent: string, kind: IntentKind, process = 'worker-1') =>
    feed({ type: 'intent', phase: 'invoke', process, intent, tenant: 't1', key: `k-${intent}`, kind })
  const attempt = (intent: string, attempt: number, process = 'worker-1') =>
    feed({ type: 'attempt', phase: 'invoke', process, intent, key: `k-${intent}`, attempt })
  const end = (intent: string, phase: 'ok' | 'fail' | 'info', process = 'worker-1') =>
    feed({ type: 'intent', phase, process, intent, tenant: 't1', key: `k-${intent}` })
  return { t, invoke, attempt, end }
}

describe('IntentTracker', () => {
  it('keeps an intent in flight from its invoke to its end, so the drain waits for a probe still retrying', () => {
    const { t, invoke, attempt, end } = tracker()
    invoke('i00001', 'normal')
    invoke('i00002', 'expired-replay')
    attempt('i00002', 1)
    attempt('i00002', 2)
    end('i00001', 'ok')
    expect(t.inFlight().map((i) => i.id)).toEqual(['i00002'])
    end('i00002', 'fail')
    expect(t.inFlight()).toEqual([])
    expect(t.withoutAnswer()).toEqual([])
  })

  it('lists raw intents that ended without a definite answer, with their key and last attempt', () => {
    const { t, invoke, attempt, end } = tracker()
    invoke('i00007', 'changed-payload')
    attempt('i00007', 3)
    end('i00007', 'info')
    // The SDK's own resume the drain covers: not listed.
    invoke('i00008', 'normal')
    end('i00008', 'info')
    expect(t.withoutAnswer()).toMatchObject([{ id: 'i00007', key: 'k-i00007', attempts: 3, tenant: 't1' }])
  })

  it('counts what a process had in flight as ended without an answer when the process dies', () => {
    const { t, invoke, attempt } = tracker()
    invoke('i00003', 'reordered', 'worker-2')
    invoke('s001-001', 'saturation', 'nemesis')
    t.processExited('worker-2')
    expect(t.inFlight().map((i) => i.id)).toEqual(['s001-001'])
    expect(t.withoutAnswer().map((i) => i.id)).toEqual(['i00003'])
    // Sent again: in flight once more.
    attempt('i00003', 2, 'worker-2')
    expect(t.inFlight().map((i) => i.id)).toEqual(['i00003', 's001-001'])
  })

  it('an SDK intent orphaned by a crash is settled by its resume, which reports it without a new invoke', () => {
    const { t, invoke, end } = tracker()
    invoke('i00004', 'normal')
    t.processExited('worker-1')
    expect(t.inFlight()).toEqual([])
    end('i00004', 'ok')
    expect(t.get('i00004')?.state).toBe('definite')
  })
})
