// `failOpen: true`: when the store cannot reserve, the handler still runs, in a plain transaction with no key record.
// It is a reservation that claims every key and stores nothing, so the attempt runner treats it like the others.
import type pg from 'pg'
import type { Claim, ReservationProtocol, ReserveRequest } from '../store/reservation.js'

export interface FailOpenReservation extends Omit<ReservationProtocol, 'reserve'> {
  /** Always claims: connects and begins a transaction (rejects only when that fails). */
  reserve(request: ReserveRequest): Promise<{ kind: 'claimed'; claim: Claim }>
}

export function failOpenReservation(pool: pg.Pool): FailOpenReservation {
  return {
    async reserve(request) {
      const client = await pool.connect()
      try {
        await client.query('BEGIN')
      } catch (error) {
        client.release(error as Error)
        throw error
      }
      return {
        kind: 'claimed',
        claim: { request, client, attempt: 1, recoveryPoint: null, replaced: null, expiresInMs: 0 },
      }
    },
    inspect: async () => ({ kind: 'free' }),
    renew: async () => true,
    async complete(claim) {
      await claim.client.query('COMMIT')
      return true
    },
    // Nothing is stored: a permanent failure is answered once and forgotten, like any request without a key.
    fail: async () => true,
    release: async () => {},
    saveRecoveryPoint: async () => false,
  }
}
