// The mutation's state machine without React, against a real local server, and the options checks of every entry.
import { createServer, type Server } from 'node:http'
import type { AddressInfo } from 'node:net'
import { createClient, memoryStore, type OncelyClient } from '@oncely/client'
import { Component } from 'react'
import { create } from 'react-test-renderer'
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest'
import {
  OncelyProvider,
  oncelyMutationOptions,
  useInvalidateOnResumed,
  useOncelyMutation,
  useOnResumed,
  usePendingIntents,
  useResumedMutations,
} from '../src/index.js'
import { IntentMutation, type IntentMutationState } from '../src/intent-mutation.js'

// Answers 503 with `Retry-After: 1` to the first attempt of each key, then 201 with the attempt number.
let server: Server
let baseUrl: string
beforeAll(async () => {
  server = createServer((request, response) => {
    request.resume()
    const attempt = Number(request.headers['oncely-attempt'])
    if (attempt === 1) {
      response.writeHead(503, { 'retry-after': '1', 'content-type': 'application/problem+json' })
      response.end('{"status":503,"title":"busy"}')
      return
    }
    response.writeHead(201, { 'content-type': 'application/json' })
    response.end(JSON.stringify({ attempt }))
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  baseUrl = `http://127.0.0.1:${(server.address() as AddressInfo).port}`
})
afterAll(() => {
  server.close()
})

const newClient = () => createClient({ baseUrl, store: memoryStore(), resumeOnOnline: false })

describe('IntentMutation', () => {
  it('goes idle → pending (key, attempt, Retry-After wait) → settled, and creating it does nothing', async () => {
    const client = newClient()
    const mutation = new IntentMutation<{ amount: number }, { attempt: number }>(() => ({
      client,
      path: '/pay',
    }))
    const states: IntentMutationState<{ attempt: number }, { amount: number }>[] = [mutation.getState()]
    mutation.subscribe(() => states.push(mutation.getState()))
    expect(await client.pending()).toEqual([])

    const before = Date.now()
    const response = await mutation.mutateAsync({ amount: 1 })
    const after = Date.now()
    expect(states.map((s) => s.status)).toEqual([
      'idle',
      'pending',
      'pending',
      'pending',
      'pending',
      'pending',
      'settled',
    ])
    expect(states[2]).toMatchObject({ intentId: response.key, key: response.key, attempts: 0 })
    expect(states[3]).toMatchObject({ attempts: 1, nextRetryAt: undefined })
    const waiting = states[4]
    expect(waiting).toMatchObject({ attempts: 1, retryReason: 'status 503' })
    const nextRetryAt = waiting?.status === 'pending' ? waiting.nextRetryAt : undefined
    expect(nextRetryAt).toBeGreaterThanOrEqual(before + 1000)
    expect(nextRetryAt).toBeLessThanOrEqual(after + 1000)
    expect(states[5]).toMatchObject({ attempts: 2, nextRetryAt: undefined, retryReason: undefined })
    expect(states[6]).toMatchObject({
      status: 'settled',
      attempts: 2,
      data: { attempt: 2 },
      replayed: false,
      response,
    })
  })

  it('a call replaced by reset() (or a newer call) no longer changes the state, but still resolves', async () => {
    const client = newClient()
    const mutation = new IntentMutation<{ amount: number }, unknown>(() => ({ client, path: '/pay' }))
    const running = mutation.mutateAsync({ amount: 2 })
    mutation.reset()
    expect(mutation.getState().status).toBe('idle')
    await expect(running).resolves.toMatchObject({ status: 201 })
    expect(mutation.getState().status).toBe('idle')
  })

  it('a cancelled call fails with the signal reason and says the intent will resume; mutate never throws', async () => {
    const client = newClient()
    const mutation = new IntentMutation<{ amount: number }, unknown>(() => ({ client, path: '/pay' }))
    const controller = new AbortController()
    client.on('retry', () => controller.abort(new Error('left the page')))
    mutation.mutate({ amount: 3 }, { signal: controller.signal })
    await vi.waitFor(() => expect(mutation.getState().status).toBe('failed'))
    expect(mutation.getState()).toMatchObject({
      error: new Error('left the page'),
      resumable: true,
      attempts: 1,
    })
    expect(await client.pending()).toHaveLength(1)
  })
})

// Never used to send: only a valid client next to the bad option.
const idleClient = createClient({
  baseUrl: 'http://127.0.0.1:9',
  store: memoryStore(),
  resumeOnOnline: false,
})

class Boundary extends Component<
  { onError: (error: unknown) => void; children: React.ReactNode },
  { failed: boolean }
> {
  override state = { failed: false }
  static getDerivedStateFromError() {
    return { failed: true }
  }
  override componentDidCatch(error: unknown) {
    this.props.onError(error)
  }
  override render() {
    return this.state.failed ? null : this.props.children
  }
}
function Mutation(props: { options: Parameters<typeof useOncelyMutation>[0] }) {
  useOncelyMutation(props.options)
  return null
}
function Pending(props: { client?: OncelyClient }) {
  usePendingIntents(props)
  return null
}
function Resumed(props: { listener: unknown }) {
  useOnResumed(props.listener as () => void, { client: idleClient })
  return null
}
function Invalidate(props: { queryClient: unknown }) {
  useInvalidateOnResumed(props.queryClient as never, () => [], { client: idleClient })
  return null
}
function Deliver(props: { queryClient: unknown; mutationKey?: unknown }) {
  useResumedMutations(props.queryClient as never, (props.mutationKey ?? (() => ['pay'])) as never, {
    client: idleClient,
  })
  return null
}

describe('bad options throw a TypeError naming the option', () => {
  const client = idleClient
  // Renders `element` and returns what rendering it threw, as an error boundary receives it (React also logs the
  // error; that is expected and silenced here).
  const renderError = async (element: React.ReactElement) => {
    const log = vi.spyOn(console, 'error').mockImplementation(() => {})
    let caught: unknown
    const renderer = create(
      <Boundary
        onError={(error) => {
          caught = error
        }}
      >
        {element}
      </Boundary>,
    )
    try {
      await vi.waitFor(() => expect(caught).toBeDefined())
      return caught
    } finally {
      renderer.unmount()
      log.mockRestore()
    }
  }

  it.each([
    ['client', <Mutation key="1" options={{ client: {} as OncelyClient, path: '/pay' }} />],
    ['path', <Mutation key="2" options={{ client, path: 7 as unknown as string }} />],
    ['intentId', <Mutation key="3" options={{ client, path: '/pay', intentId: 'cart' as never }} />],
    ['client', <Pending key="4" />],
    ['client', <OncelyProvider key="5" client={undefined as unknown as OncelyClient} />],
    ['resumeOnMount', <OncelyProvider key="6" client={client} resumeOnMount={'no' as never} />],
    ['listener', <Resumed key="7" listener="toast" />],
    ['queryClient', <Invalidate key="8" queryClient={{}} />],
    ['queryClient', <Deliver key="9" queryClient={{}} />],
    ['mutationKey', <Deliver key="10" queryClient={{ getMutationCache() {} }} mutationKey={['pay']} />],
  ])('%s', async (option, element) => {
    const error = await renderError(element)
    expect(error).toBeInstanceOf(TypeError)
    expect((error as Error).message).toContain(`\`${option}\``)
  })

  it('oncelyMutationOptions', () => {
    expect(() => oncelyMutationOptions({ client, path: undefined as never })).toThrow(/`path`/)
    expect(() => oncelyMutationOptions({ client: undefined as never, path: '/pay' })).toThrow(TypeError)
  })
})
