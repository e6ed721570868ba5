import type { IntentStore } from '../store.js'
import { OptionChecks } from '../validate.js'
import { FileStore } from './file/store.js'
import { boundStore } from './methods.js'

/** Options of {@link fileStore}. */
export interface FileStoreOptions {
  /**
   * Directory holding the intents (created if missing). Processes sharing it share their intents; it must be on a
   * local file system of this machine. Required.
   * @default none: required
   * @example '.oncely'
   */
  dir: string
  /**
   * How long a claim lasts without renewal: a process's claim on an intent it drives, and a store's claim on the
   * intents it created (its owner file). A claim whose process no longer runs is taken over at once; the holder
   * renews it every `leaseMs / 3`. When a renewal fails, the lease runs out before one succeeds, or another
   * process replaced the lock file, the claim is lost: the section driving the intent then rejects with
   * `StorageError` once it settles (its own error wins), with a `claim-lost` event as soon as the loss is noticed.
   * @default 10_000
   * @example 30_000
   */
  leaseMs?: number
}

/**
 * Keeps intents as files for Node, which every process sharing `dir` reads.
 *
 * A new intent (a request without `intentId`) costs one flush before its first byte and nothing else: its
 * write-ahead record goes into a cell never used before, in a file whose space and name were flushed ahead of time,
 * and is made durable with one fdatasync. An intent with an `intentId` gets a file of its own named after a hash of
 * it (so any process finds it): the record goes over the start of a slot prepared the same way, is flushed with one
 * fdatasync, and the slot is renamed to that name. Later versions (attempt counters, outcomes) are appended after
 * the last one without a flush, each chained to the one before by a digest, so a torn, stale or foreign version is
 * never read: a crash of the process loses nothing that was written, and a power loss may only lose versions after
 * the write-ahead one, which `resume()` then resends with the same key for the server to replay. Deleting an intent
 * overwrites its chain with zeros in place (or removes its own file); `discard` also flushes that.
 *
 * A new intent is claimed by the store that creates it (through an owner file the store keeps renewed), so it needs no lock before its
 * first byte; any other intent is driven under a lock file per intent. Unreadable intent files are moved to
 * `<dir>/quarantine/` with a `quarantined` event instead of crashing the client.
 *
 * @example
 * import { fileStore } from '@oncely/client/node'
 * createClient({ baseUrl, store: fileStore({ dir: '.oncely' }) })
 */
export function fileStore(options: FileStoreOptions): IntentStore {
  const checks = new OptionChecks('fileStore', options)
  if (typeof options.dir !== 'string' || options.dir === '') {
    checks.problem('Expected `dir` to be a non-empty directory path')
  }
  const leaseMs = checks.number('leaseMs', options.leaseMs, 10_000, Number.MIN_VALUE)
  checks.done()
  return boundStore(new FileStore(options.dir, leaseMs))
}
