// The part of autocannon's programmatic API the bench uses (the package ships no types).
declare module 'autocannon' {
  import type { EventEmitter } from 'node:events'

  interface RequestParams {
    method?: string
    path?: string
    headers?: Record<string, string>
    body?: string
  }

  interface Options {
    url: string
    connections?: number
    amount?: number
    duration?: number
    timeout?: number
    method?: string
    headers?: Record<string, string>
    body?: string
    requests?: Array<RequestParams & { setupRequest?: (request: RequestParams) => RequestParams }>
  }

  interface Result {
    errors: number
    timeouts: number
    non2xx: number
  }

  interface Instance extends EventEmitter, PromiseLike<Result> {
    on(
      event: 'response',
      listener: (client: unknown, status: number, bytes: number, ms: number) => void,
    ): this
  }

  function autocannon(options: Options): Instance
  export default autocannon
}
