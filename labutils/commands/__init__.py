"""The front ends: ``python -m labutils COMMAND`` (``main``) and each command's own parser. Nothing in the
package imports this folder; it imports the rest."""
