/** One outbox row, as a publisher receives it. */
export interface OutboxMessage {
  /** The outbox id (a UUID). Send it as the broker's dedupe id (`Nats-Msg-Id`) and as the consumer's message id. */
  id: string
  topic: string
  /** The JSON payload given to `enqueue`. */
  payload: unknown
  headers: Record<string, string>
  /** Messages with the same key are published in enqueue order, one at a time. `null` means unordered. */
  aggregateKey: string | null
  /** 1 for the first publish attempt of this row, counting attempts of crashed dispatchers too. */
  attempt: number
  createdAt: Date
}

/**
 * Where a dispatcher sends messages. `publish` resolves once the broker has accepted the message durably, and rejects
 * otherwise (the row is retried later). It may be called again for a message it already accepted (after a crash
 * between publish and mark), so the broker or the consumer must dedupe on `message.id`.
 */
export interface Publisher {
  publish(message: OutboxMessage): Promise<void>
}
