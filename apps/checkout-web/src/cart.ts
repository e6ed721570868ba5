const CART_KEY = 'oncely-demo:cart'

/**
 * The order being paid, named by a cart id kept in `localStorage`: it names the intent (`checkout:<cart>`), so a
 * double click, a second tab or a reload joins the payment already under way instead of starting another. The
 * cart is renewed once its payment has a final answer.
 */
export const cart = {
  /** The current cart's intent id, creating the cart on first use. */
  intentId(): string {
    let id = localStorage.getItem(CART_KEY)
    if (!id) {
      id = crypto.randomUUID()
      localStorage.setItem(CART_KEY, id)
    }
    return `checkout:${id}`
  },
  /** Starts a new cart if `intentId` is the current one's (its payment has a final answer). */
  close(intentId: string): void {
    if (intentId === `checkout:${localStorage.getItem(CART_KEY)}`) localStorage.removeItem(CART_KEY)
  },
}
