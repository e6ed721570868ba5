import { once } from 'node:events'
import {
  Agent,
  createServer,
  type IncomingMessage,
  request,
  type Server,
  type ServerResponse,
} from 'node:http'
import { connect, createServer as createTcpServer } from 'node:net'
import { afterEach, describe, expect, it } from 'vitest'
import { FaultProxy, type FaultProxyOptions, type ProxyFaultEvent } from '../src/proxy.js'
import { createRandom } from '../src/random.js'

interface Upstream {
  server: Server
  port: number
  bodies: string[]
  /** Responses held back by `hold`; released with `release()`. */
  held: ServerResponse[]
  hold: boolean
}

const cleanup: Array<() => Promise<unknown> | unknown> = []
afterEach(async () => {
  for (const fn of cleanup.splice(0).reverse()) await fn()
})

async function upstream(name: string): Promise<Upstream> {
  const state: Upstream = {
    server: undefined as unknown as Server,
    port: 0,
    bodies: [],
    held: [],
    hold: false,
  }
  state.server = createServer((req: IncomingMessage, res: ServerResponse) => {
    let body = ''
    req.on('data', (chunk) => {
      body += chunk
    })
    req.on('end', () => {
      state.bodies.push(body)
      if (state.hold) return void state.held.push(res)
      res.end(`${name}:${body}`)
    })
  })
  state.server.listen(0, '127.0.0.1')
  await once(state.server, 'listening')
  state.port = (state.server.address() as { port: number }).port
  cleanup.push(() => {
    state.server.closeAllConnections()
    return new Promise((resolve) => state.server.close(resolve))
  })
  return state
}

async function proxy(options: Partial<FaultProxyOptions> & Pick<FaultProxyOptions, 'upstream'>) {
  const events: ProxyFaultEvent[] = []
  const instance = await FaultProxy.start({
    random: createRandom(1),
    onFault: (event) => events.push(event),
    ...options,
  })
  cleanup.push(() => instance.close())
  return { proxy: instance, events }
}

function send(
  port: number,
  body: string,
  options: { agent?: Agent; timeoutMs?: number } = {},
): Promise<{ status: number; text: string }> {
  return new Promise((resolve, reject) => {
    const req = request(
      { host: '127.0.0.1', port, method: 'POST', path: '/v1/payments', agent: options.agent ?? false },
      (res) => {
        let text = ''
        res.on('data', (chunk) => {
          text += chunk
        })
        res.on('end', () => resolve({ status: res.statusCode ?? 0, text }))
        res.on('error', reject)
      },
    )
    req.on('error', reject)
    if (options.timeoutMs) req.setTimeout(options.timeoutMs, () => req.destroy(new Error('client timeout')))
    req.setHeader('content-type', 'application/json')
    req.end(body)
  })
}

async function until(condition: () => boolean, what: string, timeoutMs = 5000): Promise<void> {
  const deadline = Date.now() + timeoutMs
  while (!condition()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`)
    await new Promise((resolve) => setTimeout(resolve, 10))
  }
}

describe('FaultProxy (http)', () => {
  it('passes requests and responses through unchanged', async () => {
    const a = await upstream('a')
    const { proxy: p } = await proxy({ upstream: { port: a.port } })
    expect(await send(p.port, '{"n":1}')).toEqual({ status: 200, text: 'a:{"n":1}' })
    expect(p.counts.pass).toBe(1)
  })

  it('drop-request: the client sees the connection close and the server never sees the request', async () => {
    const a = await upstream('a')
    const { proxy: p, events } = await proxy({ upstream: { port: a.port } })
    p.force('drop-request')
    await expect(send(p.port, '{"n":1}')).rejects.toThrow()
    await new Promise((resolve) => setTimeout(resolve, 50))
    expect(a.bodies).toEqual([])
    expect(p.counts['drop-request']).toBe(1)
    expect(events).toEqual([
      { proxy: 'proxy', fault: 'drop-request', connection: 1, request: 'POST /v1/payments' },
    ])
  })

  it('drop-response: the server handles the request, the client never gets the answer', async () => {
    const a = await upstream('a')
    const { proxy: p } = await proxy({ upstream: { port: a.port } })
    p.force('drop-response')
    await expect(send(p.port, '{"n":2}')).rejects.toThrow()
    expect(a.bodies).toEqual(['{"n":2}'])
    expect(p.counts['drop-response']).toBe(1)
  })

  it('delay: the client times out first, and the request still reaches the server late', async () => {
    const a = await upstream('a')
    const { proxy: p } = await proxy({ upstream: { port: a.port }, delayMs: 400 })
    p.force('delay')
    await expect(send(p.port, '{"n":3}', { timeoutMs: 100 })).rejects.toThrow('client timeout')
    expect(a.bodies).toEqual([])
    await until(() => a.bodies.length === 1, 'the late delivery')
    expect(a.bodies).toEqual(['{"n":3}'])
  })

  it('delay shorter than the client timeout only slows the answer', async () => {
    const a = await upstream('a')
    const { proxy: p } = await proxy({ upstream: { port: a.port }, delayMs: 50 })
    p.force('delay')
    expect(await send(p.port, 'x', { timeoutMs: 5000 })).toEqual({ status: 200, text: 'a:x' })
  })

  it('black-hole: the connection stays open and silent until the connections are killed', async () => {
    const a = await upstream('a')
    const { proxy: p, events } = await proxy({ upstream: { port: a.port } })
    p.force('black-hole')
    const pending = send(p.port, '{"n":4}')
    await until(() => p.counts['black-hole'] === 1, 'the black hole')
    await new Promise((resolve) => setTimeout(resolve, 100))
    expect(a.bodies).toEqual([])
    expect(p.killAll()).toBe(1)
    await expect(pending).rejects.toThrow()
    expect(events.map((e) => e.fault)).toEqual(['black-hole', 'kill-connections'])
  })

  it('killAll destroys in-flight connections on both sides', async () => {
    const a = await upstream('a')
    a.hold = true
    const { proxy: p } = await proxy({ upstream: { port: a.port } })
    const pending = send(p.port, '{"n":5}')
    await until(() => a.bodies.length === 1, 'the request to arrive')
    expect(p.killAll()).toBe(2)
    await expect(pending).rejects.toThrow()
    expect(p.counts['kill-connections']).toBe(1)
  })

  it('duplicate: the same request bytes also reach the second instance; the client gets one answer', async () => {
    const a = await upstream('a')
    const b = await upstream('b')
    const { proxy: p } = await proxy({
      upstream: { port: a.port },
      duplicateTo: { port: b.port },
      reorderMs: 20,
    })
    p.force('duplicate')
    expect(await send(p.port, '{"amount":7}')).toEqual({ status: 200, text: 'a:{"amount":7}' })
    await until(() => b.bodies.length === 1, 'the duplicate')
    expect(a.bodies).toEqual(['{"amount":7}'])
    expect(b.bodies).toEqual(['{"amount":7}'])
    expect(p.counts.duplicate).toBe(1)
  })

  it('decides per request on a keep-alive connection, not once per connection', async () => {
    const a = await upstream('a')
    const { proxy: p } = await proxy({ upstream: { port: a.port } })
    const agent = new Agent({ keepAlive: true, maxSockets: 1 })
    cleanup.push(() => agent.destroy())
    p.force('pass', 'pass', 'drop-response', 'pass')
    expect((await send(p.port, '1', { agent })).text).toBe('a:1')
    expect((await send(p.port, '2', { agent })).text).toBe('a:2')
    await expect(send(p.port, '3', { agent })).rejects.toThrow()
    expect((await send(p.port, '4', { agent })).text).toBe('a:4')
    expect(a.bodies).toEqual(['1', '2', '3', '4'])
    expect(p.counts).toMatchObject({ pass: 3, 'drop-response': 1 })
  })

  it('retarget sends new connections to another instance', async () => {
    const a = await upstream('a')
    const b = await upstream('b')
    const { proxy: p } = await proxy({ upstream: { port: a.port } })
    expect((await send(p.port, '1')).text).toBe('a:1')
    p.retarget({ port: b.port })
    expect((await send(p.port, '2')).text).toBe('b:2')
    expect(p.upstream).toEqual({ port: b.port })
  })

  it('retarget with a second upstream moves the duplicates too (an instance back on another port)', async () => {
    const a = await upstream('a')
    const b = await upstream('b')
    const c = await upstream('c')
    const { proxy: p } = await proxy({ upstream: { port: a.port }, duplicateTo: { port: b.port } })
    p.retarget({ port: a.port }, { port: c.port })
    p.force('duplicate')
    expect((await send(p.port, '1')).text).toBe('a:1')
    await until(() => c.bodies.length === 1, 'the duplicate')
    expect(b.bodies).toEqual([])
    expect(c.bodies).toEqual(['1'])
  })

  it('draws the same fault sequence for the same seed and rates', async () => {
    const a = await upstream('a')
    const run = async (seed: number) => {
      const { proxy: p, events } = await proxy({
        upstream: { port: a.port },
        random: createRandom(seed),
        rates: { 'drop-request': 0.3, 'drop-response': 0.3 },
      })
      const outcomes: string[] = []
      for (let i = 0; i < 20; i++) {
        outcomes.push(
          await send(p.port, `${i}`).then(
            () => 'ok',
            () => 'error',
          ),
        )
      }
      return { outcomes, faults: events.map((e) => e.fault) }
    }
    const first = await run(1234)
    expect(await run(1234)).toEqual(first)
    expect(first.faults).toContain('drop-request')
    expect(first.faults).toContain('drop-response')
    expect(first.outcomes.filter((o) => o === 'error')).toHaveLength(first.faults.length)
  })

  it('validates its options, naming the bad one', async () => {
    const random = createRandom(1)
    await expect(FaultProxy.start({ random, upstream: { host: '10.0.0.1', port: 80 } })).rejects.toThrow(
      /`upstream.host` to be a loopback/,
    )
    await expect(FaultProxy.start({ random, upstream: { port: 0 } })).rejects.toThrow(/`upstream.port`/)
    await expect(
      FaultProxy.start({ random, upstream: { port: 1 }, rates: { duplicate: 0.1 } }),
    ).rejects.toThrow(/`duplicateTo`/)
    await expect(
      FaultProxy.start({ random, upstream: { port: 1 }, rates: { delay: 0.7, 'black-hole': 0.7 } }),
    ).rejects.toThrow(/sum to at most 1/)
    await expect(
      FaultProxy.start({ random, upstream: { port: 1 }, rates: { teleport: 0.1 } as never }),
    ).rejects.toThrow(/Unknown fault `teleport`/)
    await expect(FaultProxy.start({ random, upstream: { port: 1 }, delayMs: -1 })).rejects.toThrow(
      /`delayMs`/,
    )
  })
})

describe('FaultProxy (tcp)', () => {
  /** An echo server's port; what it receives is also appended to `heard`, when given. */
  async function echo(heard?: string[]) {
    const server = createTcpServer((socket) => {
      if (heard) socket.on('data', (data) => heard.push(data.toString()))
      socket.pipe(socket)
    })
    server.listen(0, '127.0.0.1')
    await once(server, 'listening')
    cleanup.push(() => new Promise((resolve) => server.close(resolve)))
    return (server.address() as { port: number }).port
  }
  function talk(port: number, message: string): Promise<string> {
    return new Promise((resolve, reject) => {
      const socket = connect(port, '127.0.0.1', () => socket.write(message))
      socket.on('data', (data) => {
        resolve(data.toString())
        socket.destroy()
      })
      socket.on('close', () => reject(new Error('closed')))
      socket.on('error', reject)
    })
  }

  it('passes a byte stream through and drops a connection on its first bytes when told', async () => {
    const port = await echo()
    const { proxy: p } = await proxy({ upstream: { port }, protocol: 'tcp' })
    expect(await talk(p.port, 'ping')).toBe('ping')
    p.force('drop-request')
    await expect(talk(p.port, 'ping')).rejects.toThrow('closed')
    expect(p.counts).toMatchObject({ pass: 1, 'drop-request': 1 })
  })

  it('hold: the upstream bytes wait until release, while the client still sends; a kill loses what was held', async () => {
    const heard: string[] = []
    const port = await echo(heard)
    const { proxy: p } = await proxy({ upstream: { port }, protocol: 'tcp' })
    p.hold()
    const answered = talk(p.port, 'ping')
    let early: string | undefined
    void answered.then((text) => {
      early = text
    })
    await new Promise((resolve) => setTimeout(resolve, 200))
    expect(early).toBeUndefined()
    p.release()
    expect(await answered).toBe('ping')

    p.hold()
    const lost = talk(p.port, 'pong')
    // Killed only once the connection is through the proxy (the upstream heard it): killed before the proxy accepted
    // it, it would find no connection to kill, and the release would let the answer through.
    await until(() => heard.includes('pong'), 'the upstream to hear the held connection', 10_000)
    p.killAll()
    p.release()
    await expect(lost).rejects.toThrow('closed')
  })

  it('refuses duplication in tcp mode', async () => {
    await expect(
      FaultProxy.start({
        random: createRandom(1),
        upstream: { port: 1 },
        protocol: 'tcp',
        duplicateTo: { port: 2 },
      }),
    ).rejects.toThrow(/`duplicateTo` needs `protocol: http`/)
  })
})
