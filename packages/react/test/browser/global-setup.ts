import type { TestProject } from 'vitest/node'
import { startApiServer } from '../support/api-server.js'

declare module 'vitest' {
  export interface ProvidedContext {
    /** Base URL of the real API server the browser tests talk to. */
    apiUrl: string
  }
}

// The browser tests cannot start servers: this runs in Node before them, and hands them the URL.
export default async function setup(project: TestProject) {
  const server = await startApiServer('react_browser')
  project.provide('apiUrl', server.url)
  return () => server.close()
}
