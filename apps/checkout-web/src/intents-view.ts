/** The intents table and the pending list, rendered from a small view model the page keeps up to date. */

/** How the page shows an intent. */
export type IntentState = 'pending' | 'succeeded' | 'replayed' | 'failed'

/** One row of the intents table. */
export interface IntentRow {
  id: string
  key: string
  attempts: number
  state: IntentState
  /** The payment, the error, or why it is still pending. */
  result: string
}

/** A pending intent as listed from the store. */
export interface PendingRow {
  key: string
  attempts: number
  lastError: string | undefined
}

function cell(text: string, className?: string): HTMLTableCellElement {
  const td = document.createElement('td')
  td.textContent = text
  if (className) td.className = className
  return td
}

/** Renders the intents table, newest first. */
export function renderIntents(tbody: HTMLElement, rows: Iterable<IntentRow>): void {
  const trs = [...rows].reverse().map((row) => {
    const tr = document.createElement('tr')
    tr.dataset.key = row.key
    tr.dataset.state = row.state
    tr.append(
      cell(row.key, 'key'),
      cell(String(row.attempts), 'attempts'),
      cell(row.state, `state state-${row.state}`),
      cell(row.result, 'result'),
    )
    return tr
  })
  tbody.replaceChildren(...trs)
}

/** Renders the pending list. */
export function renderPending(list: HTMLElement, count: HTMLElement, rows: PendingRow[]): void {
  count.textContent = String(rows.length)
  list.replaceChildren(
    ...rows.map((row) => {
      const li = document.createElement('li')
      li.dataset.key = row.key
      li.textContent = `${row.key}: ${row.attempts} attempt(s)${row.lastError ? `, last error: ${row.lastError}` : ''}`
      return li
    }),
  )
}
