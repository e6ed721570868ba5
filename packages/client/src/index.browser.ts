// The package's main entry as browsers resolve it (the `browser` export condition): the same exports, except that
// `createClient` defaults to `indexedDbStore()`. Node and React Native resolve index.ts, which does not import the
// IndexedDB store at all.

export { createClient } from './create-client.browser.js'
export * from './index.js'
