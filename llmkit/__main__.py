from llmkit.cli.app import main

main()
