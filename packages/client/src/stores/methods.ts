import type { IntentStore } from '../store.js'

/**
 * The store `impl` as what a store factory returns: a plain object whose methods are bound to it, so they keep
 * working when taken off the object or spread into another (a wrapping store), like those of a store written as
 * an object literal.
 */
export function boundStore(impl: Required<IntentStore>): IntentStore {
  return {
    attach: (sink) => impl.attach(sink),
    get: (id) => impl.get(id),
    set: (record, options) => impl.set(record, options),
    delete: (id, options) => impl.delete(id, options),
    list: () => impl.list(),
    exclusive: (id, fn) => impl.exclusive(id, fn),
    create: (record, fn) => impl.create(record, fn),
    close: () => impl.close(),
  }
}
