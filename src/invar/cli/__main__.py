from invar.cli.app import main

main()
